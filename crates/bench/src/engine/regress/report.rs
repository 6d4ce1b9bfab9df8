//! engine-regress.md and engine-regress.png.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::Path;

use plotters::prelude::*;

use super::compare::Outcome;
use super::{RegressReport, Tally};
use crate::report::plot::{plot_error, register_font};

/// Refusal messages and wrong answers listed in the markdown (most frequent first).
const TOP_REASONS: usize = 25;

fn percent(part: usize, whole: usize) -> String {
    if whole == 0 {
        "–".into()
    } else {
        format!("{:.1}%", 100.0 * part as f64 / whole as f64)
    }
}

fn tally_row(out: &mut String, name: &str, all: &Tally, queries: &Tally) {
    let _ = writeln!(
        out,
        "| {name} | {} | {} | {} | {} | {} | {} | **{}** | {} of {} = {} |",
        all.statements,
        all.out_of_scope,
        all.run,
        all.matched,
        all.refused,
        all.wrong,
        percent(all.matched, all.run),
        queries.matched,
        queries.run,
        percent(queries.matched, queries.run),
    );
}

/// The first words of a refusal or a difference, so that one missing feature is one line.
fn reason_key(detail: &str) -> String {
    let cut: String = detail.chars().take(90).collect();
    cut.split(" at character").next().unwrap_or(&cut).to_string()
}

fn top(report: &RegressReport, outcome: Outcome) -> Vec<(String, usize)> {
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for statement in report.statements.iter().filter(|s| s.outcome == outcome && !is_setup(report, &s.file)) {
        *counts.entry(reason_key(&statement.detail)).or_default() += 1;
    }
    let mut sorted: Vec<(String, usize)> = counts.into_iter().collect();
    sorted.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    sorted.truncate(TOP_REASONS);
    sorted
}

fn is_setup(report: &RegressReport, file: &str) -> bool {
    report.files.iter().any(|f| f.setup && f.file == file)
}

pub fn markdown(report: &RegressReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Engine breadth on PostgreSQL's regression queries\n");
    let _ = writeln!(out, "Command: `{}`\n", report.command);
    let _ = writeln!(
        out,
        "{}; load average before {}, after {}. PostgreSQL {} is the oracle (a throwaway testkit server); the engine \
         runs as its server; both get every statement of {} in the same order over the simple query protocol.\n",
        report.machine.headline(),
        report.machine.load_average_before,
        report.machine.load_average_after,
        report.postgres_version,
        report.corpus
    );
    let _ = writeln!(
        out,
        "**Matched**: the same rows (in the same order when the statement has a top-level ORDER BY; float8 cells \
         within 1e-9 when printed with the same decimals), the same row count for commands, or an error of the same \
         SQLSTATE class as PostgreSQL's. **Refused**: the engine answered 0A000 (feature not supported) — counted as \
         not run, never as passed. **Wrong**: anything else. **Out of scope**: psql meta-commands and statements \
         only PostgreSQL can mean (EXPLAIN, planner settings, indexes and statistics, server-side functions and \
         types and what uses them, system catalogs and columns, random values), never sent, each with its reason \
         below. Share = matched / in scope.\n"
    );
    let _ = writeln!(
        out,
        "| file | statements | out of scope | in scope | matched | refused | wrong | share | queries matched |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|");
    for file in report.files.iter().filter(|f| !f.setup) {
        tally_row(&mut out, &format!("{}.sql", file.file), &file.all, &file.queries);
    }
    tally_row(&mut out, "**all seven**", &report.total, &report.total_queries);
    for file in report.files.iter().filter(|f| f.setup) {
        let _ = writeln!(
            out,
            "\nSetup ({}.sql, not in the share): {} statements, {} in scope, {} matched, {} refused, {} wrong.",
            file.file, file.all.statements, file.all.run, file.all.matched, file.all.refused, file.all.wrong
        );
    }
    reasons_markdown(&mut out, report);
    out
}

fn reasons_markdown(out: &mut String, report: &RegressReport) {
    let _ = writeln!(out, "\n## What the engine refuses (0A000), most frequent first\n");
    for (reason, count) in top(report, Outcome::Refused) {
        let _ = writeln!(out, "- {count} × {reason}");
    }
    let _ = writeln!(out, "\n## Wrong: errors and differences, most frequent first\n");
    for (reason, count) in top(report, Outcome::Wrong) {
        let _ = writeln!(out, "- {count} × {reason}");
    }
    let mut scope: BTreeMap<&str, usize> = BTreeMap::new();
    for file in report.files.iter().filter(|f| !f.setup) {
        for (reason, count) in &file.out_of_scope_reasons {
            *scope.entry(reason.as_str()).or_default() += count;
        }
    }
    let mut scope: Vec<(&str, usize)> = scope.into_iter().collect();
    scope.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
    let _ = writeln!(out, "\n## Out of scope, by reason\n");
    for (reason, count) in scope {
        let _ = writeln!(out, "- {count} × {reason}");
    }
    let _ = writeln!(out, "\nEvery statement's verdict, line and detail is in engine-regress.json.");
}

/// A segment of the stacked bars: label, colour and the count it shows.
type BarPart = (&'static str, RGBColor, fn(&Tally) -> usize);

/// One horizontal stacked bar per file: matched, wrong, refused, out of scope.
pub fn plot(report: &RegressReport, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let files: Vec<_> = report.files.iter().filter(|f| !f.setup).collect();
    let root = BitMapBackend::new(path, (1200, 160 + 60 * files.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let most = files.iter().map(|f| f.all.statements).max().unwrap_or(1).max(1) as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "PostgreSQL regression statements: matched {} of {} in scope ({})",
                report.total.matched,
                report.total.run,
                percent(report.total.matched, report.total.run)
            ),
            ("sans-serif", 22),
        )
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(120)
        .build_cartesian_2d(0f64..most * 1.02, -0.5f64..files.len() as f64 - 0.5)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .y_labels(files.len())
        .y_label_formatter(&|y| {
            let index = y.round();
            let on_tick = (y - index).abs() < 1e-6 && index >= 0.0;
            on_tick.then(|| files.get(index as usize).map(|f| format!("{}.sql", f.file))).flatten().unwrap_or_default()
        })
        .x_desc("statements")
        .draw()
        .map_err(plot_error)?;
    let parts: [BarPart; 4] = [
        ("matched", GREEN, |t| t.matched),
        ("wrong", RED, |t| t.wrong),
        ("refused (0A000)", RGBColor(255, 165, 0), |t| t.refused),
        ("out of scope", RGBColor(180, 180, 180), |t| t.out_of_scope),
    ];
    let mut start = vec![0.0f64; files.len()];
    for (label, color, count) in parts {
        let bars: Vec<Rectangle<(f64, f64)>> = files
            .iter()
            .enumerate()
            .map(|(i, f)| {
                let from = start[i];
                start[i] += count(&f.all) as f64;
                Rectangle::new([(from, i as f64 - 0.35), (start[i], i as f64 + 0.35)], color.filled())
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(plot_error)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)?;
    Ok(())
}
