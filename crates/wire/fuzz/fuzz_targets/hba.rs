//! hba files and user lists as arbitrary text: parsing reports problems, never panics, and a
//! parsed file answers any connection.
#![no_main]

use bypass_wire::hba::{Connection, Hba};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(hba) = Hba::parse(&text, "fuzz") {
        for address in ["127.0.0.1", "::1", "10.1.2.3", "::ffff:10.0.0.1"] {
            for tls in [false, true] {
                let address = address.parse().expect("a valid address");
                let _ = hba.method_for(&Connection { database: "app", user: "alice", address, tls });
            }
        }
    }
    let _ = bypass_wire::auth_file::parse_entries(&text);
});
