//! `fastpath.md`: the header, then per load generator its method, both "Done when" tables, the
//! added latency at 1 and 10 clients, the per-workload tables of the shared document, CPU per
//! transaction without the load generator, the BPF cost and byte shares per cell, and the
//! mirroring table; every heading names its generator. Pure: results in, text out.

use std::fmt::Write as _;

use super::report::{FastpathDocument, FastpathResults, Target, TARGET_CLIENTS, TARGET_WORKLOAD};
use super::{ADDED_LATENCY_CLIENTS, ADDED_LATENCY_WORKLOAD, MIRROR_WORKLOAD};
use crate::bpf_stats::PROGRAM_NAMES;
use crate::pooler::markdown::{decimal, errors, header, percent, thousands, times, workload_tables};
use crate::pooler::{epoll_run, Contender, Generator};

const TITLE: &str = "Kernel fast path benchmark: direct PostgreSQL vs PgBouncer vs Bypass (user and kernel)";

/// Renders the whole document: the header once, then one part per load generator.
pub fn render_document(document: &FastpathDocument) -> String {
    let Some(first) = document.generators.first() else {
        return String::new();
    };
    let mut out = header(&first.base, TITLE);
    let _ = writeln!(out, "YCSB-like workloads: {}.\n", first.base.settings.ycsb);
    for section in &document.generators {
        out.push_str(&section_text(section));
    }
    out
}

/// Renders one generator's part with the header, as a document of one generator would be.
#[cfg(test)]
fn render(results: &FastpathResults) -> String {
    let mut out = header(&results.base, TITLE);
    let _ = writeln!(out, "YCSB-like workloads: {}.\n", results.base.settings.ycsb);
    out + &section_text(results)
}

fn section_text(results: &FastpathResults) -> String {
    let mut out = generator_method(results);
    out.push_str(&done_when(results));
    out.push_str(&done_when_kernel(results));
    out.push_str(&added_latency(results));
    out.push_str(&workload_tables(&results.base));
    out.push_str(&cpu_without_generator(results));
    out.push_str(&bpf_table(results));
    out.push_str(&mirroring(results));
    out.push_str(&errors(&results.base));
    out
}

/// `## <title> — <generator>`: every table says which load generator measured it.
fn heading(results: &FastpathResults, title: &str) -> String {
    format!("## {title} — {}\n\n", results.base.generator.label())
}

/// How this part's load generator drove the clients.
fn generator_method(results: &FastpathResults) -> String {
    let settings = &results.base.settings;
    let method = match results.base.generator {
        Generator::Pgbench => format!(
            "pgbench `-M simple -j {} -T {}` in its own process; latencies from its per-transaction log; its own CPU \
             is its process's, and grows with the sockets each of its threads polls.",
            settings.pgbench_threads, settings.duration_s
        ),
        Generator::Epoll => format!(
            "The epoll generator of `bypass-lab` in the benchmark's process: {} threads, each with one epoll \
             instance over its share of the clients, a closed loop of simple-protocol queries with the same SQL, \
             weights and zipfian keys as the pgbench scripts. After every client logged in: {} s of warm-up, then \
             a {} s window; TPS and latencies over the window (every successful transaction, HDR histogram, 3 \
             significant digits); system-wide CPU from /proc snapshots at the window's edges; the generator's own \
             CPU from its threads' CPU clocks (user + system). select-only, simple-update and mirroring run with \
             pgbench only.",
            settings.pgbench_threads,
            epoll_run::WARMUP.as_secs(),
            epoll_run::window(settings.duration_s).as_secs()
        ),
    };
    format!("# Load generator: {}\n\n{method}\n\n", results.base.generator.label())
}

fn done_when(results: &FastpathResults) -> String {
    let text = heading(results, "Done when (issue 4)")
        + &format!(
            "Targets at {} clients on {} (Tigger's published deltas) and the added \
         latency and mirroring limits; measured in this run.\n\n",
            thousands(f64::from(TARGET_CLIENTS)),
            TARGET_WORKLOAD.name()
        );
    text + &target_table(&results.done_when)
}

fn done_when_kernel(results: &FastpathResults) -> String {
    let text = heading(results, "Done when (issue 24)")
        + "The kernel path against Bypass in user space (select1 and ycsb-b at 10, 50, 1,000 and 10,000 clients), \
           the share of request and answer bytes the kernel carried (1,000 and 10,000 clients), the added latency \
           at 1 client against PgBouncer's, and CPU per transaction without the load generator's own; only the \
           cells this run measured are listed.\n\n";
    text + &target_table(&results.done_when_kernel)
}

fn target_table(targets: &[Target]) -> String {
    let mut text = String::from("| goal | limit | measured | status |\n|---|---|---:|---|\n");
    for target in targets {
        let status = match target.status {
            "PASS" => "**PASS**",
            "MISS" => "**MISS**",
            other => other,
        };
        let _ = writeln!(text, "| {} | {} | {} | {status} |", target.goal, target.limit, decimal(target.measured, 3));
    }
    text.push('\n');
    text
}

fn added_latency(results: &FastpathResults) -> String {
    if results.added_latency.is_empty() {
        return String::new();
    }
    let title = format!(
        "Added latency at {} clients ({})",
        ADDED_LATENCY_CLIENTS.map(|clients| clients.to_string()).join(" and "),
        ADDED_LATENCY_WORKLOAD.name()
    );
    let mut text = heading(results, &title)
        + &format!(
            "At 1 client every query waits for the previous one: the difference \
         from direct PostgreSQL is what the pooler adds to each round trip. At 10 clients no client waits for a \
         server (pool of {}).\n\n| clients | contender | mean (ms) | p50 (ms) | added mean (µs) | added p50 (µs) |\n\
         |---:|---|---:|---:|---:|---:|\n",
            results.base.settings.pool_size
        );
    for row in &results.added_latency {
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} |",
            row.clients,
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

/// System-wide busy CPU-µs per transaction minus pgbench's own, per cell: direct PostgreSQL at
/// pool-size clients, then every pooler at every client count.
fn cpu_without_generator(results: &FastpathResults) -> String {
    let base = &results.base;
    let pool_size = base.settings.pool_size;
    let contenders = [Contender::Pgbouncer, Contender::Pgbouncer2, Contender::Bypass, Contender::BypassKernel];
    let contenders: Vec<Contender> = contenders.into_iter().filter(|c| base.contenders.contains(c)).collect();
    let own = match base.generator {
        Generator::Pgbench => "pgbench's process, whose cost grows with the sockets it polls",
        Generator::Epoll => "the epoll generator's threads, by their CPU clocks",
    };
    let mut text = heading(results, "CPU per transaction without the load generator")
        + &format!(
            "System-wide busy CPU-µs per transaction minus the load generator's own ({own}; it runs on the same 2 \
             cores): what PostgreSQL, the pooler and the kernel work for them cost. Direct PostgreSQL runs \
             {pool_size} clients, as many as the pools have servers.\n\n| workload | direct ({pool_size} clients) \
             | clients |"
        );
    for contender in &contenders {
        let _ = write!(text, " {} |", contender.label());
    }
    text.push_str("\n|---|---:|---:|");
    text.push_str(&"---:|".repeat(contenders.len()));
    text.push('\n');
    let value = |workload, clients, contender| {
        decimal(base.cell(workload, clients, contender).and_then(|cell| cell.non_generator_cpu_us_per_txn), 1)
    };
    for &workload in &base.workloads {
        for &clients in &base.clients {
            let _ = write!(
                text,
                "| {} | {} | {} |",
                workload.name(),
                value(workload, pool_size, Contender::Direct),
                thousands(f64::from(clients))
            );
            for &contender in &contenders {
                let _ = write!(text, " {} |", value(workload, clients, contender));
            }
            text.push('\n');
        }
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
    let mut text = heading(results, "BPF cost (Bypass kernel)")
        + "From BPF run-time statistics, on for the benchmark (a `BPF_ENABLE_STATS` \
         descriptor: what `kernel.bpf_stats_enabled=1` does, without touching the shared sysctl): run_time_ns \
         ÷ run_cnt of each verdict program between bpftool reads before and after the load generator ran, and \
         both programs' run time ÷ transactions it completed. Kernel counters from the `fp_counters` map: transactions whose \
         server the kernel released ÷ transactions completed, and passes to user space per transaction; from \
         `fp_pool_counts`: request (client→server) and answer bytes the kernel forwarded ÷ all it saw (the \
         rest went through user space).\n\n\
         | workload | clients | contender |";
    for name in PROGRAM_NAMES {
        let _ = write!(text, " {name} ns/run |");
    }
    text.push_str(
        " BPF ns/txn | verdicts/txn | released in kernel | passes/txn | request bytes in kernel | answer bytes in kernel |\n|---|---:|---|",
    );
    text.push_str(&"---:|".repeat(PROGRAM_NAMES.len() + 6));
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
            " {} | {} | {} | {} | {} | {} |",
            decimal(cell.bpf_ns_per_txn, 0),
            decimal(cell.bpf_verdicts_per_txn, 2),
            percent(cell.kernel_transaction_share),
            decimal(cell.passes_per_txn, 3),
            share(cell.request_bytes_in_kernel),
            share(cell.answer_bytes_in_kernel)
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

/// A share with one decimal in percent: 99.9% and 99% differ for the byte targets.
fn share(fraction: Option<f64>) -> String {
    fraction.filter(|v| v.is_finite()).map_or("—".to_string(), |v| format!("{:.1}%", v * 100.0))
}

fn mirroring(results: &FastpathResults) -> String {
    if results.base.generator != Generator::Pgbench {
        return String::new();
    }
    if !results.mirroring_requested {
        return heading(results, "Mirroring") + "Not measured in this run (`--mirroring` runs it).\n\n";
    }
    let title = format!(
        "Mirroring ({}; every query of `postgres` also sent to `shadow`, replies dropped)",
        MIRROR_WORKLOAD.name()
    );
    let mut text = heading(results, &title)
        + "| mode | clients | TPS without / with | mean without / with (ms) | p99 without / with (ms) | mean with ÷ without | p99 with ÷ without |\n\
         |---|---:|---|---|---|---:|---:|\n";
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
    use crate::pooler::{Document, Workload};

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
                "| mean latency, ycsb-b at 10000 clients, Bypass kernel ÷ PgBouncer | ≤ 0.65× | 0.500 | **PASS** |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| p99 latency, ycsb-b at 10000 clients, Bypass kernel ÷ PgBouncer | ≤ 0.44× | 0.500 | **MISS** |"
            ),
            "{text}"
        );
        assert!(text.contains("| 1 | Bypass kernel | 0.062 | 0.041 | 12.0 | 8.0 |"), "{text}");
        assert!(
            text.contains(
                "| ycsb-b | 10,000 | Bypass kernel | 400 | 400 | 1234 | 4.00 | 99% | 0.010 | 50.0% | 99.9% |"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "| request bytes carried in the kernel, ycsb-b at 10000 clients, Bypass kernel | ≥ 0.9 | 0.500 | **MISS** |"
            ),
            "{text}"
        );
        assert!(text.contains("## CPU per transaction without the load generator"), "{text}");
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

    // Goal: with `--generator both` each generator's runs land in its own part and every part's
    // tables name it (mirroring only with pgbench); method: one run of each into a document.
    #[test]
    fn document_keeps_generators_apart() {
        let args = crate::fastpath::tests::parse(&["--generator", "both", "--workloads", "select1,select-only"]);
        let mut base = crate::pooler::report::tests::sample_results(Vec::new());
        base.workloads = args.workloads.clone();
        let mut document = FastpathDocument::new(base, &args);
        let mut epoll = crate::pooler::report::tests::run(Workload::Select1, 1000, Contender::Bypass, 30_000.0, 3.0);
        epoll.generator = Generator::Epoll;
        document.push(crate::pooler::report::tests::run(Workload::Select1, 1000, Contender::Bypass, 20_000.0, 4.0));
        document.push(epoll);
        let [pgbench, epoll] = &document.generators[..] else { panic!("two parts") };
        assert_eq!((pgbench.base.runs.len(), pgbench.base.cells[0].tps), (1, Some(20_000.0)));
        assert_eq!((epoll.base.runs.len(), epoll.base.cells[0].tps), (1, Some(30_000.0)));
        assert_eq!(epoll.base.workloads, vec![Workload::Select1], "select-only runs with pgbench only");
        let text = render_document(&document);
        assert_eq!(text.matches("# Kernel fast path benchmark").count(), 1, "{text}");
        assert!(text.contains("# Load generator: pgbench\n"), "{text}");
        assert!(text.contains("# Load generator: epoll generator\n"), "{text}");
        assert!(text.contains("## select1 — `SELECT 1;` script, -M simple — epoll generator"), "{text}");
        assert!(text.contains("## select-only — pgbench -S"), "{text}");
        assert!(text.contains("## CPU per transaction without the load generator — epoll generator"), "{text}");
        assert_eq!(text.matches("## Mirroring").count(), 1, "{text}");
    }
}
