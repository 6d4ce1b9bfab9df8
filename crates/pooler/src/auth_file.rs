//! The user list (PgBouncer's `userlist.txt` format): [`bypass_wire::auth_file`], shared with the
//! dispatcher and the engine through the front door.

pub use bypass_wire::auth_file::{parse_entries, AuthFile, Secret, AUTH_FILE_BYTES_MAX, AUTH_FILE_USERS_MAX};
