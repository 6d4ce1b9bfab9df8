//! docs/config.md matches the `settings!` declarations.

#[test]
fn config_reference_is_current() {
    // Goal: the published reference describes every setting as the code does. Method: regenerate
    // it from the declarations and compare with docs/config.md (BYPASS_BLESS=1 rewrites the file).
    let generated = bypass_pooler::config_doc::reference();
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/config.md");
    if std::env::var_os("BYPASS_BLESS").is_some() {
        std::fs::write(path, &generated).expect("write docs/config.md");
    }
    let published = std::fs::read_to_string(path).unwrap_or_default();
    assert!(generated.contains("| `max_prepared_statements` |"), "the generator missed fields");
    assert!(generated.contains("| `pool_size` |"), "the generator missed [databases] fields");
    assert_eq!(
        published, generated,
        "docs/config.md is stale: run `cargo run -p bypass-cli -- config-reference > docs/config.md`"
    );
}
