//! The server's mock key kept across restarts (PostgreSQL keeps its mock authentication nonce
//! in pg_control for the same reason): with a key per process, an unknown user's mock salt
//! changed at every restart while a real user's stayed, so two logins a restart apart told
//! them apart.
//!
//! The key lives in a file (64 hex digits, mode 0600), written once by the first server that
//! needs it: by default beside the auth file (`<auth file>.mock-key`), or wherever the server's
//! configuration names ([`mock_key_in`]; a pooler without an auth file keeps it beside its
//! configuration file). Where that file cannot be written (a read-only configuration
//! directory), the key is derived from the auth file's bytes: stable while the file is
//! unchanged, and as secret as the file.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bypass_wire::auth::MockKey;

/// Where the key of the users in `auth_file` is kept.
pub fn mock_key_path(auth_file: &Path) -> PathBuf {
    let mut name = auth_file.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".mock-key");
    auth_file.with_file_name(name)
}

/// The mock key for a server whose users are in `auth_file`: read from its key file, written
/// there first if there is none, or derived from the auth file when it cannot be written.
pub fn mock_key(auth_file: &Path) -> std::io::Result<MockKey> {
    mock_key_in(&mock_key_path(auth_file), Some(auth_file))
}

/// The mock key kept in `key_file`: read, or written there first if there is none. When that
/// fails, derived from `auth_file` if there is one (else the error: the caller decides).
pub fn mock_key_in(key_file: &Path, auth_file: Option<&Path>) -> std::io::Result<MockKey> {
    match (stored_key(key_file), auth_file) {
        (Ok(key), _) => Ok(key),
        (Err(error), Some(auth_file)) => {
            let key = derived_key(auth_file)?;
            tracing::warn!(path = %key_file.display(), %error, "mock key not stored; derived from the auth file");
            Ok(key)
        }
        (Err(error), None) => Err(error),
    }
}

/// Reads the key at `path`, creating it (random, mode 0600) when it does not exist.
fn stored_key(path: &Path) -> std::io::Result<MockKey> {
    let created = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path);
    match created {
        Ok(mut file) => {
            let key = MockKey::random();
            file.write_all(hex(&key.to_bytes()).as_bytes())?;
            file.sync_all()?;
            Ok(key)
        }
        Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => read_key(path),
        Err(error) => Err(error),
    }
}

fn read_key(path: &Path) -> std::io::Result<MockKey> {
    let text = std::fs::read_to_string(path)?;
    let invalid = || std::io::Error::new(std::io::ErrorKind::InvalidData, "expected 64 hex digits");
    let text = text.trim();
    if text.len() != 64 {
        return Err(invalid());
    }
    let mut key = [0u8; 32];
    for (index, byte) in key.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&text[2 * index..2 * index + 2], 16).map_err(|_| invalid())?;
    }
    Ok(MockKey::from_bytes(key))
}

/// A key from the auth file's bytes (SHA-256 under a fixed label).
fn derived_key(auth_file: &Path) -> std::io::Result<MockKey> {
    use sha2::{Digest, Sha256};
    let mut digest = Sha256::new();
    digest.update(b"bypass mock key\0");
    digest.update(std::fs::read(auth_file)?);
    Ok(MockKey::from_bytes(digest.finalize().into()))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the first call writes the key, later calls read the same key, and a directory that
    // cannot be written still gives a stable key; method: a temp dir, then a path under a file.
    #[test]
    fn the_key_is_written_once_and_read_back() {
        let dir = tempfile::tempdir().expect("temp dir");
        let auth_file = dir.path().join("userlist.txt");
        std::fs::write(&auth_file, "\"alice\" \"pw\"\n").expect("auth file");
        let first = mock_key(&auth_file).expect("created").to_bytes();
        assert_eq!(mock_key(&auth_file).expect("read").to_bytes(), first);
        assert_eq!(std::fs::read_to_string(mock_key_path(&auth_file)).expect("stored"), hex(&first));
        let mode = std::fs::metadata(mock_key_path(&auth_file)).expect("metadata").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077, 0, "only the owner reads it");
        std::fs::write(mock_key_path(&auth_file), "not hex").expect("corrupt");
        let derived = mock_key(&auth_file).expect("derived").to_bytes();
        assert_eq!(mock_key(&auth_file).expect("derived again").to_bytes(), derived);
        assert_ne!(derived, first);
    }

    // Goal: a key file named apart from any auth file is created once and read back, and one
    // that cannot be written is an error (nothing to derive from); method: a temp dir.
    #[test]
    fn a_key_file_of_its_own_is_kept_or_refused() {
        let dir = tempfile::tempdir().expect("temp dir");
        let key_file = dir.path().join("keys").join("mock-key");
        assert!(mock_key_in(&key_file, None).is_err(), "its folder does not exist");
        std::fs::create_dir(dir.path().join("keys")).expect("folder");
        let first = mock_key_in(&key_file, None).expect("created").to_bytes();
        assert_eq!(mock_key_in(&key_file, None).expect("read").to_bytes(), first);
        let mode = std::fs::metadata(&key_file).expect("metadata").permissions();
        assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o077, 0, "only the owner reads it");
    }
}
