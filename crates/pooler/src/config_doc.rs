//! `docs/config.md`, generated from the doc comments of the configuration structs in
//! `config.rs`, so the reference cannot drift from the code (a test compares the two).

/// The structs documented, with the TOML table each one is.
const TABLES: [(&str, &str); 2] = [("PoolerSettings", "[pooler]"), ("DatabaseEntry", "[databases.NAME]")];

/// The Markdown reference for `config.rs`'s source text.
pub fn reference(source: &str) -> String {
    let mut out = String::from(
        "# Configuration reference\n\n\
         Generated from the doc comments in `crates/pooler/src/config.rs` \
         (`cargo run -p bypass-cli -- config-reference > docs/config.md`); a test fails when it is stale.\n\
         Unknown keys are errors; `bypass check-config FILE` lists every problem at once. Settings marked\n\
         *restart* are read at start only; everything else changes with SIGHUP or the console's `RELOAD`.\n",
    );
    for (name, table) in TABLES {
        out.push_str(&format!("\n## `{table}`\n\n| key | type | meaning |\n|---|---|---|\n"));
        for field in fields(source, name) {
            let restart = crate::config::RESTART_ONLY.contains(&field.name.as_str());
            let note = if restart && name == "PoolerSettings" { " *restart*" } else { "" };
            out.push_str(&format!("| `{}` | `{}` | {}{} |\n", field.name, field.kind, field.doc, note));
        }
    }
    out
}

struct Field {
    name: String,
    kind: String,
    doc: String,
}

/// The public fields of `pub struct NAME { … }` with their joined `///` comments.
fn fields(source: &str, name: &str) -> Vec<Field> {
    let header = format!("pub struct {name} {{");
    let mut lines = source.lines().skip_while(|line| line.trim() != header).skip(1);
    let mut fields = Vec::new();
    let mut doc: Vec<String> = Vec::new();
    for line in lines.by_ref() {
        let line = line.trim();
        if line == "}" {
            break;
        }
        if let Some(text) = line.strip_prefix("///") {
            doc.push(text.trim().replace('|', "\\|"));
        } else if let Some((field, kind)) = line.strip_prefix("pub ").and_then(|rest| rest.split_once(':')) {
            let kind = kind.trim().trim_end_matches(',').to_owned();
            fields.push(Field { name: field.trim().to_owned(), kind, doc: doc.join(" ") });
            doc.clear();
        }
    }
    fields
}
