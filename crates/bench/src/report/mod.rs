//! The one report module every benchmark writes through: order statistics ([`stats`]: one
//! median, one percentile), the machine description ([`machine`]), the plot font ([`plot`]) and
//! the writer of `<name>.{json,md,png}` ([`write`]).
//!
//! ```text
//!   runs ─► stats::median / stats::percentile_sorted / stats::median_run ─► ratios
//!   machine::Machine::now() … finish() ─┐
//!   results (Serialize) ────────────────┼─► write(out, name, …) ─► name.json, name.md
//!   markdown (String) ──────────────────┘         └─ plot(name.png) with plot::register_font()
//! ```
//!
//! Invariants:
//! - Every published median and percentile comes from [`stats`]; a benchmark defines none of
//!   its own.
//! - The numbers are written before the plot is drawn, and a failing plot costs only the PNG
//!   (with a warning): a missing font never loses a measured result.

pub mod machine;
pub mod plot;
pub mod stats;

use std::path::Path;

use anyhow::Context;
use serde::Serialize;

/// Writes `<name>.json` (pretty, newline-terminated) and `<name>.md` into `out_dir` (created if
/// missing), then draws `<name>.png` with `draw`; a failing `draw` is reported on stderr and
/// leaves the JSON and markdown in place.
pub fn write(
    out_dir: &Path,
    name: &str,
    results: &impl Serialize,
    markdown: &str,
    draw: impl FnOnce(&Path) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let json = serde_json::to_string_pretty(results).context("serialising results")?;
    write_file(&out_dir.join(format!("{name}.json")), &(json + "\n"))?;
    write_file(&out_dir.join(format!("{name}.md")), markdown)?;
    if let Err(error) = draw(&out_dir.join(format!("{name}.png"))) {
        eprintln!("bench {name}: warning: no plot: {error:#}");
    }
    Ok(())
}

/// Writes `text` to `path`, naming the path in the error.
pub fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the three files land under their names, and a failing plot keeps the numbers;
    // method: write into a temporary directory with a plot that fails.
    #[test]
    fn writes_json_and_markdown_even_when_the_plot_fails() {
        let directory = tempfile::tempdir().expect("temporary directory");
        let out = directory.path().join("results");
        write(&out, "demo", &serde_json::json!({"ratio": 1.5}), "# Demo\n", |png| {
            assert_eq!(png, out.join("demo.png"));
            anyhow::bail!("no font")
        })
        .expect("writes");
        let json = std::fs::read_to_string(out.join("demo.json")).expect("json written");
        assert!(json.contains("\"ratio\": 1.5") && json.ends_with('\n'), "{json}");
        assert_eq!(std::fs::read_to_string(out.join("demo.md")).expect("markdown written"), "# Demo\n");
        assert!(!out.join("demo.png").exists());
    }
}
