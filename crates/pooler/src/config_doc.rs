//! `docs/config.md`, generated from the [`settings!`](crate::config) declarations in
//! `config.rs`, so the reference cannot drift from the code (a test compares the two).

use crate::config::{Applies, DatabaseEntry, PoolerSettings, Setting, UserEntry};

/// The Markdown reference of every setting.
pub fn reference() -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the `settings!` declarations in `crates/pooler/src/config.rs` \
         (`cargo run -p bypass-cli -- config-reference > docs/config.md`); a test fails when it is stale.\n\
         Unknown keys are errors; `bypass check-config FILE` lists every problem at once. Settings marked\n\
         *restart* are read at start only; everything else changes with SIGHUP or the console's `RELOAD`.\n",
    );
    let tables: [(&str, &[Setting]); 3] = [
        ("[pooler]", PoolerSettings::SETTINGS),
        ("[databases.NAME]", DatabaseEntry::SETTINGS),
        ("[users.NAME]", UserEntry::SETTINGS),
    ];
    for (table, settings) in tables {
        out.push_str(&format!("\n## `{table}`\n\n| key | type | meaning |\n|---|---|---|\n"));
        for setting in settings {
            let note = if setting.applies == Applies::Restart { " *restart*" } else { "" };
            let meaning = setting.description().replace('|', "\\|");
            out.push_str(&format!("| `{}` | `{}` | {meaning}{note} |\n", setting.name, setting.kind));
        }
    }
    out
}
