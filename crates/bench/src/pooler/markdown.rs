//! `<benchmark>.md`: one table per workload (rows = clients, columns = contenders and ratios), a
//! sanity table per workload, and every error in full. Pure: results in, text out. The pieces
//! are public so `bench fastpath` composes its document from them.

use std::fmt::Write as _;

use super::report::{CellSummary, Results};
use super::{Contender, Generator, Workload};

/// The title of `pooler.md`.
const POOLER_TITLE: &str = "Pooler benchmark: direct PostgreSQL vs PgBouncer vs Bypass";

/// Renders the whole `pooler.md`.
pub fn render(results: &Results) -> String {
    let mut out = String::new();
    out.push_str(&header(results, POOLER_TITLE));
    out.push_str(&workload_tables(results));
    out.push_str(&errors(results));
    out
}

/// The main and sanity tables of every workload of the matrix.
pub fn workload_tables(results: &Results) -> String {
    let mut out = String::new();
    for &workload in &results.workloads {
        out.push_str(&main_table(results, workload));
        out.push_str(&sanity_table(results, workload));
        out.push_str(&repetition_table(results, workload));
    }
    out
}

/// Title, command, date, machine, versions, load averages and the method in one paragraph.
pub fn header(results: &Results, title: &str) -> String {
    let machine = &results.machine;
    let versions = &results.versions;
    let settings = &results.settings;
    let revision = versions.git_revision.as_deref().map_or(String::new(), |revision| format!(" (git {revision})"));
    let mut text = format!("# {title}\n\n");
    let _ = writeln!(
        text,
        "`{}` — {} — {}; load average {} at the start, {} after the last run.\n",
        results.command,
        results.date,
        machine.headline(),
        machine.load_average_before,
        machine.load_average_after
    );
    let _ = writeln!(
        text,
        "{}; {}; PgBouncer: {}; Bypass: {}{revision}.\n",
        first_words(&versions.postgres, 2),
        versions.pgbench,
        versions.pgbouncer,
        versions.bypass
    );
    let _ = writeln!(
        text,
        "Transaction pooling, pool size {}, {} auth, max_client_conn {}; {}, median of {} repetition(s), \
         contenders interleaved. Each cell: {}. Ratios are subject ÷ peer: TPS higher is better, latency and CPU \
         lower is better. {}.\n",
        settings.pool_size,
        settings.auth_type,
        settings.max_client_conn,
        generator_command(results),
        settings.repetitions,
        cell_method(results),
        machine.note
    );
    text
}

/// How the generator of `results` was run, for the method paragraph.
fn generator_command(results: &Results) -> String {
    let settings = &results.settings;
    match results.generator {
        Generator::Pgbench => format!("pgbench `-M simple -j {} -T {}`", settings.pgbench_threads, settings.duration_s),
        Generator::Epoll => format!(
            "the epoll generator ({} threads; after every client logged in, {} s of warm-up and a {} s window)",
            settings.pgbench_threads,
            super::epoll_run::WARMUP.as_secs(),
            super::epoll_run::window(settings.duration_s).as_secs()
        ),
    }
}

/// What a table cell holds and where each figure comes from.
fn cell_method(results: &Results) -> String {
    match results.generator {
        Generator::Pgbench => format!(
            "TPS (pgbench, without connection time), mean / p50 / p99 / p99.9 latency (per-transaction log, steady \
             state), system-wide busy CPU-µs per transaction (steady state: {})",
            results.settings.cpu_window
        ),
        Generator::Epoll => "TPS, mean / p50 / p99 / p99.9 latency and system-wide busy CPU-µs per transaction, all \
                             over the generator's measured window"
            .to_string(),
    }
}

fn main_table(results: &Results, workload: Workload) -> String {
    let pairs = ratio_pairs(results);
    let generator = results.generator.label();
    let mut text = format!("## {} — {} — {generator}\n\n| clients |", workload.name(), workload.description());
    for contender in &results.contenders {
        let _ = write!(text, " {} |", contender.label());
    }
    for (subject, peer) in &pairs {
        let _ = write!(text, " {} ÷ {} (TPS / mean / p99 / CPU) |", subject.label(), peer.label());
    }
    text.push_str("\n|---:|");
    text.push_str(&"---|".repeat(results.contenders.len() + pairs.len()));
    text.push('\n');
    for &clients in &results.clients {
        let _ = write!(text, "| {} |", thousands(f64::from(clients)));
        for &contender in &results.contenders {
            let cell = results.cell(workload, clients, contender);
            let _ =
                write!(text, " {} |", contender_cell(cell, contender.runs_at(clients, results.direct_clients_max())));
        }
        for &(subject, peer) in &pairs {
            let _ = write!(text, " {} |", ratio_cell(results, workload, clients, subject, peer));
        }
        text.push('\n');
    }
    text.push('\n');
    text
}

/// The ratio pairs whose both sides are in the run.
fn ratio_pairs(results: &Results) -> Vec<(Contender, Contender)> {
    let ran = |contender: &Contender| results.contenders.contains(contender);
    results.ratio_pairs.iter().copied().filter(|(subject, peer)| ran(subject) && ran(peer)).collect()
}

/// One contender's numbers in a table cell; `runs_here` tells "not run yet" from "—".
pub fn contender_cell(cell: Option<&CellSummary>, runs_here: bool) -> String {
    let Some(cell) = cell else {
        return if runs_here { "not run yet".to_string() } else { "—".to_string() };
    };
    let Some(tps) = cell.tps else {
        let error = cell.errors.first().map_or("no result", String::as_str);
        return format!("**error**: {}", escape(&shorten(error, 120)));
    };
    let mut text = format!(
        "{} TPS<br>{} / {} / {} / {} ms<br>{} µs/txn",
        thousands(tps),
        decimal(cell.latency_mean_ms, 2),
        decimal(cell.p50_ms, 2),
        decimal(cell.p99_ms, 2),
        decimal(cell.p999_ms, 2),
        decimal(cell.cpu_us_per_txn, 1)
    );
    if !cell.errors.is_empty() {
        let _ = write!(text, "<br>⚠ {} of {} runs with errors", cell.errors.len(), cell.runs);
    }
    text
}

fn ratio_cell(results: &Results, workload: Workload, clients: u32, subject: Contender, peer: Contender) -> String {
    match results.ratio(workload, clients, subject, peer) {
        Some(versus) => format!(
            "{} / {} / {} / {}",
            times(versus.tps),
            times(versus.mean),
            times(versus.p99),
            times(versus.cpu_us_per_txn)
        ),
        None => "—".to_string(),
    }
}

fn sanity_table(results: &Results, workload: Workload) -> String {
    let generator = results.generator.label();
    let connect = match results.generator {
        Generator::Pgbench => {
            "pgbench's initial connection time (pgbench 15 counts -T from its start, so this time is \
                               not measured load)"
        }
        Generator::Epoll => "the time until every client had logged in (before the warm-up and the window)",
    };
    let mut text = format!(
        "Sanity for {} ({generator}): Little's law TPS × mean latency ÷ clients (≈ 1), failed transactions, pooler \
         and load generator CPU-µs per transaction (the generator's share of the system-wide busy CPU in \
         parentheses: it runs on the same 2 cores), {connect}.\n\n| clients |",
        workload.name()
    );
    for contender in &results.contenders {
        let _ = write!(text, " {} |", contender.label());
    }
    text.push_str("\n|---:|");
    text.push_str(&"---|".repeat(results.contenders.len()));
    text.push('\n');
    for &clients in &results.clients {
        let _ = write!(text, "| {} |", thousands(f64::from(clients)));
        for &contender in &results.contenders {
            let cell = results.cell(workload, clients, contender).filter(|cell| cell.tps.is_some());
            let entry = cell.map_or("—".to_string(), |cell| {
                format!(
                    "L {} · {} failed · pooler {} · {generator} {} ({}) · connect {} s",
                    decimal(cell.little_ratio, 2),
                    cell.failed_transactions,
                    decimal(cell.pooler_cpu_us_per_txn, 1),
                    decimal(cell.generator_cpu_us_per_txn, 1),
                    percent(crate::pooler::report::divide(cell.generator_cpu_us_per_txn, cell.cpu_us_per_txn)),
                    decimal(cell.initial_connection_ms.map(|ms| ms / 1000.0), 1)
                )
            });
            let _ = write!(text, " {entry} |");
        }
        text.push('\n');
    }
    text.push('\n');
    text
}

/// Each ratio pair's TPS ratio round by round (the contenders of a round run back to back), so
/// a reader sees how far a median ratio is from run-to-run noise. Empty with one repetition.
fn repetition_table(results: &Results, workload: Workload) -> String {
    let pairs = ratio_pairs(results);
    if results.settings.repetitions < 2 || pairs.is_empty() {
        return String::new();
    }
    let mut text = format!("TPS ratios of {} round by round:\n\n| clients |", workload.name());
    for (subject, peer) in &pairs {
        let _ = write!(text, " {} ÷ {} |", subject.label(), peer.label());
    }
    text.push_str("\n|---:|");
    text.push_str(&"---|".repeat(pairs.len()));
    text.push('\n');
    for &clients in &results.clients {
        let _ = write!(text, "| {} |", thousands(f64::from(clients)));
        for &(subject, peer) in &pairs {
            let rounds: Vec<String> = (0..results.settings.repetitions)
                .map(|round| {
                    let tps = |contender| {
                        results
                            .runs
                            .iter()
                            .find(|run| {
                                (run.workload, run.clients, run.contender, run.repetition)
                                    == (workload, clients, contender, round)
                            })?
                            .tps
                    };
                    times(crate::pooler::report::divide(tps(subject), tps(peer)))
                })
                .collect();
            let _ = write!(text, " {} |", rounds.join(" · "));
        }
        text.push('\n');
    }
    text.push('\n');
    text
}

/// Every failed run with its full error.
pub fn errors(results: &Results) -> String {
    let failed: Vec<_> = results.runs.iter().filter(|run| run.error.is_some()).collect();
    if failed.is_empty() {
        return String::new();
    }
    let mut text = String::from("## Errors\n\n");
    for run in failed {
        let error = run.error.as_deref().unwrap_or_default().replace('\n', " ");
        let _ = writeln!(
            text,
            "- {} {} clients={} rep={}: {error}",
            run.contender.label(),
            run.workload.name(),
            run.clients,
            run.repetition + 1
        );
    }
    text.push('\n');
    text
}

/// `12,345` for 12345.4.
pub fn thousands(value: f64) -> String {
    if !value.is_finite() {
        return "—".to_string();
    }
    let digits = format!("{:.0}", value.abs());
    let mut grouped = String::new();
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index) % 3 == 0 {
            grouped.push(',');
        }
        grouped.push(digit);
    }
    if value < -0.5 {
        grouped.insert(0, '-');
    }
    grouped
}

pub fn decimal(value: Option<f64>, places: usize) -> String {
    value.filter(|v| v.is_finite()).map_or("—".to_string(), |v| format!("{v:.places$}"))
}

/// `37%` for 0.37.
pub fn percent(fraction: Option<f64>) -> String {
    fraction.filter(|v| v.is_finite()).map_or("—".to_string(), |v| format!("{:.0}%", v * 100.0))
}

pub fn times(value: Option<f64>) -> String {
    value.filter(|v| v.is_finite()).map_or("—".to_string(), |v| format!("{v:.2}×"))
}

fn first_words(text: &str, count: usize) -> String {
    text.split_whitespace().take(count).collect::<Vec<_>>().join(" ")
}

fn shorten(text: &str, chars_max: usize) -> String {
    if text.chars().count() <= chars_max {
        return text.to_string();
    }
    text.chars().take(chars_max).collect::<String>() + "…"
}

/// Makes text safe inside a table cell: pipes escaped, line breaks flattened.
fn escape(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pooler::report::tests::{run, sample_results as results};

    // Goal: the table has a row per client count, a column per contender plus ratio columns,
    // direct shows "—" above 50 clients and errors are escaped; method: render synthetic results.
    #[test]
    fn renders_tables_ratios_and_errors() {
        let mut broken = run(Workload::Select1, 1000, Contender::Pgbouncer2, 0.0, 0.0);
        broken.tps = None;
        broken.error = Some("pgbench exited | too many clients".to_string());
        let text = render(&results(vec![
            run(Workload::Select1, 50, Contender::Direct, 42_000.0, 2.0),
            run(Workload::Select1, 50, Contender::Pgbouncer, 20_000.0, 4.0),
            run(Workload::Select1, 50, Contender::Pgbouncer2, 25_000.0, 3.0),
            run(Workload::Select1, 50, Contender::Bypass, 30_000.0, 2.0),
            run(Workload::Select1, 1000, Contender::Pgbouncer, 20_000.0, 80.0),
            broken,
            run(Workload::Select1, 1000, Contender::Bypass, 30_000.0, 40.0),
        ]));
        assert!(text.contains("`bypass bench pooler --clients 50,1000` — 2026-01-02T03:04:05Z — **2-core machine**"));
        assert!(text.contains("load average 0.10 0.20 0.30 at the start, 1.10 1.20 1.30 after the last run"));
        let header =
            "| clients | direct PG | PgBouncer | PgBouncer ×2 | Bypass | Bypass ÷ PgBouncer (TPS / mean / p99 / \
                      CPU) | Bypass ÷ PgBouncer ×2 (TPS / mean / p99 / CPU) |";
        assert!(text.contains(header), "{text}");
        assert!(text.contains("| 50 | 42,000 TPS<br>1.00 / 0.67 / 2.00 / 2.40 ms<br>47.6 µs/txn |"), "{text}");
        assert!(text.contains("| 1.50× / 0.50× / 0.50× / 0.67× | 1.20× / 0.67× / 0.67× / 0.83× |"), "{text}");
        let row_1000 = text.lines().find(|line| line.starts_with("| 1,000 |")).expect("row for 1000 clients");
        assert!(row_1000.starts_with("| 1,000 | — | 20,000 TPS"), "{row_1000}");
        assert!(row_1000.contains("**error**: pgbench exited \\| too many clients"), "{row_1000}");
        assert!(row_1000.ends_with("| 1.50× / 0.50× / 0.50× / 0.67× | — / — / — / — |"), "{row_1000}");
        assert!(text.contains("## Errors\n\n- PgBouncer ×2 select1 clients=1000 rep=1: pgbench exited"));
        assert!(text.contains("L 1.00 · 0 failed · pooler — · pgbench 11.9 (25%) · connect"), "{text}");
    }

    // Goal: each round's TPS ratio is shown next to the median; method: two rounds, one pair.
    #[test]
    fn shows_ratios_round_by_round() {
        let mut second = run(Workload::Select1, 50, Contender::Bypass, 18_000.0, 2.0);
        second.repetition = 1;
        let mut peer_second = run(Workload::Select1, 50, Contender::Pgbouncer, 20_000.0, 4.0);
        peer_second.repetition = 1;
        let mut sample = results(vec![
            run(Workload::Select1, 50, Contender::Pgbouncer, 20_000.0, 4.0),
            run(Workload::Select1, 50, Contender::Bypass, 30_000.0, 2.0),
            peer_second,
            second,
        ]);
        sample.settings.repetitions = 2;
        let text = render(&sample);
        assert!(text.contains("TPS ratios of select1 round by round"), "{text}");
        assert!(text.contains("| 50 | 1.50× · 0.90× |"), "{text}");
    }

    // Goal: thousands separators are placed right; method: a few magnitudes.
    #[test]
    fn groups_thousands() {
        assert_eq!(thousands(0.4), "0");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1000.0), "1,000");
        assert_eq!(thousands(1_234_567.6), "1,234,568");
        assert_eq!(thousands(f64::NAN), "—");
    }
}
