//! `fastpath.md`: the header and per-workload tables of the shared document, then the "Done
//! when" table, the added latency at 1 client, the BPF cost per verdict and per transaction, and
//! the mirroring table. Pure: results in, text out.

use std::fmt::Write as _;

use super::report::{FastpathResults, TARGET_CLIENTS, TARGET_WORKLOAD};
use super::{ADDED_LATENCY_CLIENTS, ADDED_LATENCY_WORKLOAD, MIRROR_WORKLOAD};
use crate::bpf_stats::PROGRAM_NAMES;
use crate::pooler::markdown::{decimal, errors, header, percent, thousands, times, workload_tables};
use crate::pooler::Contender;

const TITLE: &str = "Kernel fast path benchmark: direct PostgreSQL vs PgBouncer vs Bypass (user and kernel)";

/// Renders the whole document.
pub fn render(results: &FastpathResults) -> String {
    let mut out = header(&results.base, TITLE);
    let _ = writeln!(out, "YCSB-like workloads: {}.\n", results.base.settings.ycsb);
    out.push_str(&done_when(results));
    out.push_str(&added_latency(results));
    out.push_str(&workload_tables(&results.base));
    out.push_str(&bpf_table(results));
    out.push_str(&mirroring(results));
    out.push_str(&errors(&results.base));
    out
}

fn done_when(results: &FastpathResults) -> String {
    let mut text = format!(
        "## Done when (issue 4)\n\nTargets at {} clients on {} (Tigger's published deltas) and the added \
         latency and mirroring limits; measured in this run.\n\n| goal | limit | measured | status |\n|---|---|---:|---|\n",
        thousands(f64::from(TARGET_CLIENTS)),
        TARGET_WORKLOAD.name()
    );
    for target in &results.done_when {
        let status = match target.status {
            "PASS" => "**PASS**",
            "MISS" => "**MISS**",
            other => other,
        };
        let _ = writeln!(text, "| {} | {} | {} | {status} |", target.goal, target.limit, decimal(target.measured, 2));
    }
    text.push('\n');
    text
}

fn added_latency(results: &FastpathResults) -> String {
    if results.added_latency.is_empty() {
        return String::new();
    }
    let mut text = format!(
        "## Added latency at {ADDED_LATENCY_CLIENTS} client ({})\n\nOne pgbench client, so every query waits for the \
         previous one: the difference from direct PostgreSQL is what the pooler adds to each round trip.\n\n\
         | contender | mean (ms) | p50 (ms) | added mean (µs) | added p50 (µs) |\n|---|---:|---:|---:|---:|\n",
        ADDED_LATENCY_WORKLOAD.name()
    );
    for row in &results.added_latency {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} |",
            row.contender.label(),
            decimal(row.mean_ms, 3),
            decimal(row.p50_ms, 3),
            decimal(row.added_mean_us, 1),
            decimal(row.added_p50_us, 1)
        );
    }
    text.push('\n');
    text
}

fn bpf_table(results: &FastpathResults) -> String {
    let kernel_cells: Vec<_> = results
        .base
        .cells
        .iter()
        .filter(|cell| cell.contender.is_kernel() && (cell.bpf_ns_per_txn.is_some() || !cell.errors.is_empty()))
        .collect();
    if kernel_cells.is_empty() {
        return String::new();
    }
    let mut text = String::from(
        "## BPF cost (Bypass kernel)\n\nFrom BPF run-time statistics, on for the benchmark (a `BPF_ENABLE_STATS` \
         descriptor: what `kernel.bpf_stats_enabled=1` does, without touching the shared sysctl): run_time_ns \
         ÷ run_cnt of each verdict program between bpftool reads before and after pgbench, and both programs' run \
         time ÷ transactions pgbench completed. Kernel counters from the `fp_counters` map: transactions whose \
         server the kernel released ÷ transactions completed, and passes to user space per transaction.\n\n\
         | workload | clients | contender |",
    );
    for name in PROGRAM_NAMES {
        let _ = write!(text, " {name} ns/run |");
    }
    text.push_str(" BPF ns/txn | verdicts/txn | released in kernel | passes/txn |\n|---|---:|---|");
    text.push_str(&"---:|".repeat(PROGRAM_NAMES.len() + 4));
    text.push('\n');
    for cell in kernel_cells {
        let _ = write!(
            text,
            "| {} | {} | {} |",
            cell.workload.name(),
            thousands(f64::from(cell.clients)),
            cell.contender.label()
        );
        for name in PROGRAM_NAMES {
            let _ = write!(text, " {} |", decimal(cell.bpf_ns_per_run.get(name).copied(), 0));
        }
        let _ = writeln!(
            text,
            " {} | {} | {} | {} |",
            decimal(cell.bpf_ns_per_txn, 0),
            decimal(cell.bpf_verdicts_per_txn, 2),
            percent(cell.kernel_transaction_share),
            decimal(cell.passes_per_txn, 3)
        );
    }
    let missing: Vec<String> = results
        .base
        .runs
        .iter()
        .filter_map(|run| run.bpf_error.as_ref().map(|error| format!("- {}: {error}", run.workload.name())))
        .collect();
    if !missing.is_empty() {
        let _ = writeln!(text, "\nBPF figures missing:\n{}", missing.join("\n"));
    }
    text.push('\n');
    text
}

fn mirroring(results: &FastpathResults) -> String {
    if !results.mirroring_requested {
        return "## Mirroring\n\nNot measured in this run (`--mirroring` runs it).\n\n".to_string();
    }
    let mut text = format!(
        "## Mirroring ({}; every query of `postgres` also sent to `shadow`, replies dropped)\n\n\
         | mode | clients | TPS without / with | mean without / with (ms) | p99 without / with (ms) | mean with ÷ without | p99 with ÷ without |\n\
         |---|---:|---|---|---|---:|---:|\n",
        MIRROR_WORKLOAD.name()
    );
    for row in &results.mirroring {
        let mode = if row.mode == "kernel" { Contender::BypassKernel.label() } else { Contender::Bypass.label() };
        let tps = |value: Option<f64>| value.map_or("—".to_string(), thousands);
        let _ = writeln!(
            text,
            "| {mode} ({} mirroring) | {} | {} / {} | {} / {} | {} / {} | {} | {} |",
            row.mode,
            thousands(f64::from(row.clients)),
            tps(row.without_tps),
            tps(row.with_tps),
            decimal(row.without_mean_ms, 3),
            decimal(row.with_mean_ms, 3),
            decimal(row.without_p99_ms, 3),
            decimal(row.with_p99_ms, 3),
            times(row.mean_ratio),
            times(row.p99_ratio)
        );
    }
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fastpath::report::tests::{fastpath_results, with_mean};
    use crate::pooler::Workload;

    // Goal: the document has the kernel ratio columns, the Done-when verdicts, the added latency,
    // BPF and mirroring sections filled from the runs; method: render synthetic results.
    #[test]
    fn renders_fastpath_sections() {
        let mut kernel = with_mean(Workload::YcsbB, 10_000, Contender::BypassKernel, 26_100.0, 287.5);
        kernel.bpf = Some(crate::bpf_stats::BpfCost {
            programs: PROGRAM_NAMES
                .iter()
                .map(|name| crate::bpf_stats::ProgramCost {
                    name: name.to_string(),
                    runs: 10,
                    run_time_ns: 4_000,
                    ns_per_run: Some(400.0),
                })
                .collect(),
            ns_per_txn: 1_234.0,
            verdicts_per_txn: 4.0,
            kernel_counters: Default::default(),
            kernel_transaction_share: Some(0.99),
            passes_per_txn: Some(0.01),
            pool_counters: Default::default(),
            request_bytes_in_kernel: Some(0.5),
            answer_bytes_in_kernel: Some(0.999),
        });
        let runs = vec![
            with_mean(Workload::YcsbB, 10_000, Contender::Pgbouncer, 17_400.0, 575.0),
            with_mean(Workload::YcsbB, 10_000, Contender::Bypass, 20_000.0, 500.0),
            kernel,
            with_mean(Workload::Select1, 1, Contender::Direct, 20_000.0, 0.050),
            with_mean(Workload::Select1, 1, Contender::BypassKernel, 19_000.0, 0.062),
            with_mean(Workload::SimpleUpdate, 10, Contender::Bypass, 5_000.0, 2.0),
            with_mean(Workload::SimpleUpdate, 10, Contender::BypassMirror, 4_000.0, 2.5),
        ];
        let text = render(&fastpath_results(runs, true));
        assert!(text.starts_with("# Kernel fast path benchmark"), "{text}");
        assert!(text.contains("**2-core machine**"), "{text}");
        assert!(text.contains("random_zipfian(1, 100000, 1.001)"), "{text}");
        assert!(text.contains("| Bypass kernel ÷ PgBouncer (TPS / mean / p99 / CPU) | Bypass kernel ÷ PgBouncer ×2 (TPS / mean / p99 / CPU) | Bypass kernel ÷ Bypass (TPS / mean / p99 / CPU) |"), "{text}");
        assert!(text.contains("| 1.50× / 0.50× / 0.50× / 0.67× | — | 1.30× / 0.57× / 0.57× / 0.77× |"), "{text}");
        assert!(
            text.contains(
                "| mean latency, ycsb-b at 10000 clients, Bypass kernel ÷ PgBouncer | ≤ 0.65× | 0.50 | **PASS** |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| p99 latency, ycsb-b at 10000 clients, Bypass kernel ÷ PgBouncer | ≤ 0.44× | 0.50 | **MISS** |"
            ),
            "{text}"
        );
        assert!(text.contains("| Bypass kernel | 0.062 | 0.041 | 12.0 | 8.0 |"), "{text}");
        assert!(text.contains("| ycsb-b | 10,000 | Bypass kernel | 400 | 400 | 1234 | 4.00 | 99% | 0.010 |"), "{text}");
        assert!(
            text.contains(
                "| Bypass (user mirroring) | 10 | 5,000 / 4,000 | 2.000 / 2.500 | 4.000 / 5.000 | 1.25× | 1.25× |"
            ),
            "{text}"
        );
        assert!(text.contains("| Bypass kernel (kernel mirroring) | 100 | — / — |"), "{text}");
        let plain = render(&fastpath_results(Vec::new(), false));
        assert!(plain.contains("Not measured in this run (`--mirroring` runs it)."), "{plain}");
    }
}
