//! What a window of the probe's run cost the whole machine, per transaction: softirqs and
//! interrupts (IPIs among them) from /proc, context switches, kworker and ksoftirqd runs, CPU
//! time by process group, and the fast-path programs' run time (with `kernel.bpf_stats_enabled`).

use std::collections::BTreeMap;
use std::fs;
use std::time::Instant;

use bypass_pooler::RunningProxy;

/// Clock ticks per second of /proc's CPU times (USER_HZ).
const TICKS_PER_SECOND: f64 = 100.0;

/// Process groups whose CPU time the window reports (by `comm`; the pooler is this process).
const GROUPS: [&str; 5] = ["pooler", "pgbench", "postgres", "kworker", "ksoftirqd"];

/// Counters read at one instant.
pub struct Snapshot {
    at: Instant,
    transactions: u64,
    softirqs: BTreeMap<String, u64>,
    interrupts: BTreeMap<String, u64>,
    context_switches: u64,
    busy_ticks: u64,
    /// Per process of a group: its group, CPU ticks and (kworkers) context switches. Kept per
    /// process because kworkers come and go: a window counts only what each one did in it.
    processes: BTreeMap<u32, (&'static str, u64, u64)>,
    programs: BTreeMap<&'static str, (u64, u64)>,
}

impl Snapshot {
    pub fn take(running: &RunningProxy, pgbench: u32) -> Snapshot {
        let shared = running.shared();
        let programs = shared.fastpath.iter().flat_map(|fast| fast.program_stats());
        Snapshot {
            at: Instant::now(),
            transactions: shared.pools().iter().map(|pool| pool.transactions()).sum(),
            softirqs: per_cpu_table("/proc/softirqs"),
            interrupts: per_cpu_table("/proc/interrupts"),
            context_switches: stat_field("ctxt").first().copied().unwrap_or(0),
            busy_ticks: busy_ticks(),
            processes: processes(pgbench),
            programs: programs.map(|p| (p.name, (p.run_count, p.run_time_ns))).collect(),
        }
    }
}

/// Prints the window between two snapshots, per transaction.
pub fn report(before: &Snapshot, after: &Snapshot) {
    let transactions = after.transactions.saturating_sub(before.transactions).max(1) as f64;
    let seconds = after.at.duration_since(before.at).as_secs_f64();
    println!("  window: {seconds:.1} s, {transactions} transactions, {:.0} TPS", transactions / seconds);
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / transactions;
    let us = |a: u64, b: u64| per(a, b) * 1e6 / TICKS_PER_SECOND;
    let (ticks, kworker_switches) = group_deltas(before, after);
    println!(
        "  busy CPU {:.1} us/txn, context switches {:.2}/txn, kworker switches {:.2}/txn",
        us(before.busy_ticks, after.busy_ticks),
        per(before.context_switches, after.context_switches),
        per(0, kworker_switches)
    );
    let groups: Vec<String> = GROUPS.iter().map(|g| format!("{g} {:.1}", us(0, ticks[*g]))).collect();
    println!("  CPU us/txn by process: {}", groups.join(", "));
    println!("  softirqs/txn: {}", table_per(&before.softirqs, &after.softirqs, transactions));
    println!("  interrupts/txn: {}", table_per(&before.interrupts, &after.interrupts, transactions));
    for (name, (runs, ns)) in &after.programs {
        let (runs0, ns0) = before.programs.get(name).copied().unwrap_or_default();
        let (runs, ns) = (runs - runs0, ns - ns0);
        let mean = ns.checked_div(runs).unwrap_or(0);
        println!(
            "  {name}: {:.2} runs/txn, {mean} ns/run, {:.0} ns/txn",
            runs as f64 / transactions,
            ns as f64 / transactions
        );
    }
}

/// Rows whose per-transaction count is at least 0.01, largest first.
fn table_per(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>, transactions: f64) -> String {
    let mut rows: Vec<(String, f64)> = after
        .iter()
        .map(|(name, &n)| {
            (name.clone(), n.saturating_sub(before.get(name).copied().unwrap_or(0)) as f64 / transactions)
        })
        .filter(|(_, per)| *per >= 0.01)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1));
    rows.iter().map(|(name, per)| format!("{name} {per:.2}")).collect::<Vec<_>>().join(", ")
}

/// /proc/softirqs or /proc/interrupts: each row's name (a numbered IRQ with its device's) and
/// its count summed over CPUs.
fn per_cpu_table(path: &str) -> BTreeMap<String, u64> {
    let text = fs::read_to_string(path).unwrap_or_default();
    let cpus = text.lines().next().map_or(0, |header| header.split_whitespace().count());
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let total = rest.split_whitespace().take(cpus).map_while(|n| n.parse::<u64>().ok()).sum();
            let name = name.trim();
            let device = rest.split_whitespace().skip(cpus).last().filter(|_| name.parse::<u32>().is_ok());
            Some((device.map_or(name.to_owned(), |device| format!("{name}/{device}")), total))
        })
        .collect()
}

fn stat_field(name: &str) -> Vec<u64> {
    let text = fs::read_to_string("/proc/stat").unwrap_or_default();
    let line = text.lines().find(|line| line.split_whitespace().next() == Some(name)).unwrap_or_default();
    line.split_whitespace().skip(1).filter_map(|n| n.parse().ok()).collect()
}

/// user + nice + system + irq + softirq + steal of all CPUs.
fn busy_ticks() -> u64 {
    let cpu = stat_field("cpu");
    [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| cpu.get(i)).sum()
}

/// CPU ticks by group and kworker context switches in the window, process by process (one that
/// started in it counts from zero; one that ended in it is lost).
fn group_deltas(before: &Snapshot, after: &Snapshot) -> (BTreeMap<&'static str, u64>, u64) {
    let mut ticks: BTreeMap<&'static str, u64> = GROUPS.iter().map(|g| (*g, 0)).collect();
    let mut kworker_switches = 0;
    for (pid, &(group, cpu, switches)) in &after.processes {
        let (_, cpu0, switches0) = before.processes.get(pid).copied().unwrap_or((group, 0, 0));
        *ticks.get_mut(group).expect("a known group") += cpu.saturating_sub(cpu0);
        kworker_switches += switches.saturating_sub(switches0);
    }
    (ticks, kworker_switches)
}

/// Every process of a group: (group, utime + stime ticks, context switches if a kworker).
fn processes(pgbench: u32) -> BTreeMap<u32, (&'static str, u64, u64)> {
    let mut found = BTreeMap::new();
    let me = std::process::id();
    for entry in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else { continue };
        let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((comm, fields)) =
            stat.split_once(") ").map(|(head, rest)| (head.rsplit('(').next().unwrap_or(""), rest))
        else {
            continue;
        };
        let group = match comm {
            _ if pid == me => "pooler",
            _ if pid == pgbench => "pgbench",
            "postgres" => "postgres",
            c if c.starts_with("kworker") => "kworker",
            c if c.starts_with("ksoftirqd") => "ksoftirqd",
            _ => continue,
        };
        let fields: Vec<u64> = fields.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect();
        // utime and stime are fields 14 and 15 of stat, 12 and 13 after "pid (comm) ".
        let cpu = fields.get(11).unwrap_or(&0) + fields.get(12).unwrap_or(&0);
        found.insert(pid, (group, cpu, if group == "kworker" { switches(pid) } else { 0 }));
    }
    found
}

/// Voluntary plus involuntary context switches of a thread.
fn switches(pid: u32) -> u64 {
    let text = fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .filter(|line| line.contains("ctxt_switches"))
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}
