//! The cost of the eBPF fast path as the kernel counts it: BPF run-time statistics switched on
//! for the benchmark (a `BPF_ENABLE_STATS` descriptor, as `kernel.bpf_stats_enabled=1` does),
//! then `run_time_ns` / `run_cnt` of the `fp_client` and `fp_server`
//! programs read with `bpftool` before and after each run, plus the fast path's own counters
//! (the per-CPU `fp_counters` map: transactions released in the kernel, passes to user space).
//!
//! ```text
//!   StatsSwitch::enable()  stats fd open ─────────────────────────────────── drop: fd closed
//!   per run:  sample(pooler pids) ── pgbench ── sample(pooler pids) ──► cost(before, after, txns)
//!   sample:   /proc/<pooler>/fdinfo/* → ids of the programs and maps the pooler holds
//!             bpftool prog show -j  (fp_client / fp_server among those ids)
//!             bpftool map show -j → fp_counters id → bpftool map dump id N -j (summed over CPUs)
//! ```
//!
//! Programs and maps are matched by name *and* by the pooler holding a descriptor to them, so
//! programs loaded by tests or other poolers on the same machine are never counted (Debian's
//! bpftool 7.1 prints no `pids`). The parsers are pure functions over bpftool's JSON and fdinfo
//! text, unit-tested with literal output.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::Value;

/// `BPF_ENABLE_STATS` from `enum bpf_cmd` (linux/bpf.h, since 5.8).
const BPF_ENABLE_STATS: libc::c_long = 32;

/// `BPF_STATS_RUN_TIME` from `enum bpf_stats_type`.
const BPF_STATS_RUN_TIME: u32 = 0;

/// The verdict programs of the fast path (crates/fastpath/bpf/fastpath.bpf.c).
pub const PROGRAM_NAMES: [&str; 2] = ["fp_client", "fp_server"];

/// The fast path's per-CPU counter map.
const COUNTERS_MAP: &str = "fp_counters";

/// The fast path's per-pool, per-CPU map of where bytes went (summed over pools here).
const POOL_COUNTERS_MAP: &str = "fp_pool_counts";

const BPFTOOL: &str = "bpftool";

/// The `fp_counters` field counting transactions whose server the kernel released.
const KERNEL_TRANSACTIONS_FIELD: &str = "transactions";

/// The `fp_counters` fields counting bytes passed up to user space start with this.
const PASSES_PREFIX: &str = "passes_";

/// Keeps BPF run-time statistics on while alive: the same effect as
/// `sysctl kernel.bpf_stats_enabled=1`, through the kernel's reference-counted
/// `BPF_ENABLE_STATS` descriptor. Closing it (on drop, on an error, on Ctrl-C, even when the
/// process is killed) turns statistics off again unless someone else still wants them, so the
/// shared sysctl is never written and nobody else's setting is clobbered. Statistics cost a
/// little on every program run, so they are on only while benchmarking.
pub struct StatsSwitch {
    /// Held only so that dropping the switch closes it, which is what turns statistics off.
    _descriptor: std::os::fd::OwnedFd,
}

impl StatsSwitch {
    pub fn enable() -> Result<StatsSwitch> {
        // `union bpf_attr` for this command is one u32 (the statistics type); the kernel zero
        // fills the rest of the union.
        let attr: u32 = BPF_STATS_RUN_TIME;
        let size = std::mem::size_of_val(&attr) as libc::c_long;
        // SAFETY: bpf(2) reads `size` bytes from a valid, live u32; on success it returns a new
        // file descriptor that nothing else owns.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, BPF_ENABLE_STATS, &attr as *const u32, size) };
        if fd < 0 {
            let error = std::io::Error::last_os_error();
            bail!("bpf(BPF_ENABLE_STATS) failed: {error} (needs root and Linux ≥ 5.8)");
        }
        let fd = std::os::fd::RawFd::try_from(fd).context("bpf(BPF_ENABLE_STATS) returned an impossible fd")?;
        // SAFETY: `fd` was just returned by the kernel and is owned by nothing else.
        let descriptor = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        Ok(StatsSwitch { _descriptor: descriptor })
    }
}

/// One program's cumulative counters at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ProgramCounters {
    pub name: String,
    pub id: u64,
    pub run_time_ns: u64,
    pub run_count: u64,
}

/// Everything read at one instant: the programs' counters and the fast path's own counters
/// (field name → sum over CPUs), each empty when not found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sample {
    pub programs: Vec<ProgramCounters>,
    pub kernel_counters: BTreeMap<String, u64>,
    /// `fp_pool_counts` fields summed over pools and CPUs.
    pub pool_counters: BTreeMap<String, u64>,
}

/// The BPF programs and maps some processes hold descriptors to, by id (two id spaces).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owned {
    pub program_ids: Vec<u64>,
    pub map_ids: Vec<u64>,
}

/// Reads the counters of the fast-path programs and map owned by any of `owner_pids`.
pub fn sample(owner_pids: &[u32]) -> Result<Sample> {
    let owned = owned_ids(owner_pids);
    let programs = parse_programs(&bpftool(&["prog", "show"])?, &owned)?;
    let maps = bpftool(&["map", "show"])?;
    let summed = |name: &str| -> Result<BTreeMap<String, u64>> {
        match parse_map_id(&maps, name, &owned)? {
            Some(id) => parse_percpu_sum(&bpftool(&["map", "dump", "id", &id.to_string()])?),
            None => Ok(BTreeMap::new()),
        }
    };
    Ok(Sample { programs, kernel_counters: summed(COUNTERS_MAP)?, pool_counters: summed(POOL_COUNTERS_MAP)? })
}

fn bpftool(args: &[&str]) -> Result<String> {
    let output = Command::new(BPFTOOL)
        .arg("-j")
        .args(args)
        .output()
        .with_context(|| format!("running {BPFTOOL} (Debian package bpftool)"))?;
    if !output.status.success() {
        bail!("{BPFTOOL} {} failed: {}", args.join(" "), String::from_utf8_lossy(&output.stderr).trim());
    }
    String::from_utf8(output.stdout).context("bpftool printed non-UTF-8")
}

/// The ids of every BPF program and map that `pids` hold a descriptor to, from the
/// `prog_id:` / `map_id:` lines of `/proc/<pid>/fdinfo/*`. Unreadable entries are skipped.
pub fn owned_ids(pids: &[u32]) -> Owned {
    let mut owned = Owned::default();
    for pid in pids {
        let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else { continue };
        for entry in entries.flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            add_fdinfo_ids(&text, &mut owned);
        }
    }
    owned
}

/// Adds the program or map id named in one fdinfo text, if any.
pub fn add_fdinfo_ids(fdinfo: &str, owned: &mut Owned) {
    for line in fdinfo.lines() {
        let Some((key, value)) = line.split_once(':') else { continue };
        let Ok(id) = value.trim().parse::<u64>() else { continue };
        match key.trim() {
            "prog_id" => owned.program_ids.push(id),
            "map_id" => owned.map_ids.push(id),
            _ => {}
        }
    }
}

/// The fast-path programs in `bpftool -j prog show` output that are in `owned`.
/// Programs without `run_time_ns` (statistics off) count as zero.
pub fn parse_programs(json: &str, owned: &Owned) -> Result<Vec<ProgramCounters>> {
    let entries: Vec<Value> = serde_json::from_str(json).context("parsing bpftool prog show -j")?;
    let mut programs: Vec<ProgramCounters> = entries
        .iter()
        .filter(|entry| entry["name"].as_str().is_some_and(|name| PROGRAM_NAMES.contains(&name)))
        .filter(|entry| entry["id"].as_u64().is_some_and(|id| owned.program_ids.contains(&id)))
        .map(|entry| ProgramCounters {
            name: entry["name"].as_str().unwrap_or_default().to_string(),
            id: entry["id"].as_u64().unwrap_or_default(),
            run_time_ns: entry["run_time_ns"].as_u64().unwrap_or_default(),
            run_count: entry["run_cnt"].as_u64().unwrap_or_default(),
        })
        .collect();
    programs.sort_by(|a, b| (&a.name, a.id).cmp(&(&b.name, b.id)));
    Ok(programs)
}

/// The id of the map called `name` among `owned`, from `bpftool -j map show`.
pub fn parse_map_id(json: &str, name: &str, owned: &Owned) -> Result<Option<u64>> {
    let entries: Vec<Value> = serde_json::from_str(json).context("parsing bpftool map show -j")?;
    Ok(entries
        .iter()
        .filter(|entry| entry["name"].as_str() == Some(name))
        .filter_map(|entry| entry["id"].as_u64())
        .find(|id| owned.map_ids.contains(id)))
}

/// Sums a per-CPU map's BTF-formatted values over every key and CPU, field by field, from
/// `bpftool -j map dump`. Without BTF there are no field names and the result is empty.
pub fn parse_percpu_sum(json: &str) -> Result<BTreeMap<String, u64>> {
    let entries: Vec<Value> = serde_json::from_str(json).context("parsing bpftool map dump -j")?;
    let mut sums = BTreeMap::new();
    for entry in &entries {
        let per_cpu = entry["formatted"]["values"].as_array().map(Vec::as_slice).unwrap_or_default();
        for fields in per_cpu.iter().filter_map(|cpu| cpu["value"].as_object()) {
            for (field, value) in fields {
                if let Some(value) = value.as_u64() {
                    *sums.entry(field.clone()).or_insert(0) += value;
                }
            }
        }
    }
    Ok(sums)
}

/// One program's cost over a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ProgramCost {
    pub name: String,
    pub runs: u64,
    pub run_time_ns: u64,
    pub ns_per_run: Option<f64>,
}

/// The fast path's cost over one run: per program and per transaction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BpfCost {
    pub programs: Vec<ProgramCost>,
    /// Σ run time of both programs ÷ transactions pgbench completed.
    pub ns_per_txn: f64,
    /// Σ verdict runs ÷ transactions.
    pub verdicts_per_txn: f64,
    /// Differences of the `fp_counters` fields over the run (empty when the map was not found).
    pub kernel_counters: BTreeMap<String, u64>,
    /// Transactions whose server the kernel released ÷ transactions completed. A release in the
    /// kernel says nothing about the request: it may have waited in user space and been written
    /// from there (see the byte shares).
    pub kernel_transaction_share: Option<f64>,
    /// Passes to user space (Σ `passes_*` fields) per transaction.
    pub passes_per_txn: Option<f64>,
    /// Differences of the `fp_pool_counts` fields over the run, summed over pools.
    pub pool_counters: BTreeMap<String, u64>,
    /// Request bytes forwarded in the kernel ÷ all request bytes the fast path saw (the rest
    /// were passed to user space, which read them and wrote them to a server).
    pub request_bytes_in_kernel: Option<f64>,
    /// The same for answer bytes.
    pub answer_bytes_in_kernel: Option<f64>,
}

/// The cost between two samples over `transactions`; `None` when no program was seen or
/// nothing completed. Programs are matched by id, so one that was reloaded in between is skipped.
pub fn cost(before: &Sample, after: &Sample, transactions: u64) -> Option<BpfCost> {
    if transactions == 0 || after.programs.is_empty() {
        return None;
    }
    let mut programs: Vec<ProgramCost> = Vec::new();
    for name in PROGRAM_NAMES {
        let (mut runs, mut run_time_ns) = (0, 0);
        for end in after.programs.iter().filter(|program| program.name == name) {
            let start = before.programs.iter().find(|program| program.id == end.id);
            let (start_runs, start_ns) = start.map_or((0, 0), |start| (start.run_count, start.run_time_ns));
            runs += end.run_count.saturating_sub(start_runs);
            run_time_ns += end.run_time_ns.saturating_sub(start_ns);
        }
        let ns_per_run = (runs > 0).then(|| run_time_ns as f64 / runs as f64);
        programs.push(ProgramCost { name: name.to_string(), runs, run_time_ns, ns_per_run });
    }
    let total_ns: u64 = programs.iter().map(|program| program.run_time_ns).sum();
    let total_runs: u64 = programs.iter().map(|program| program.runs).sum();
    let kernel_counters = differences(&before.kernel_counters, &after.kernel_counters);
    let pool_counters = differences(&before.pool_counters, &after.pool_counters);
    let bytes_share = |direction: &str| {
        let field = |path: &str| pool_counters.get(&format!("{direction}_bytes_{path}")).copied();
        let (forwarded, passed) = (field("forwarded")?, field("passed")?);
        (forwarded + passed > 0).then(|| forwarded as f64 / (forwarded + passed) as f64)
    };
    let per_txn = |count: u64| count as f64 / transactions as f64;
    let kernel_transaction_share = kernel_counters.get(KERNEL_TRANSACTIONS_FIELD).map(|&count| per_txn(count));
    let passes: Vec<u64> =
        kernel_counters.iter().filter(|(field, _)| field.starts_with(PASSES_PREFIX)).map(|(_, &n)| n).collect();
    let passes_per_txn = (!passes.is_empty()).then(|| per_txn(passes.iter().sum()));
    Some(BpfCost {
        programs,
        ns_per_txn: total_ns as f64 / transactions as f64,
        verdicts_per_txn: total_runs as f64 / transactions as f64,
        kernel_counters,
        kernel_transaction_share,
        passes_per_txn,
        request_bytes_in_kernel: bytes_share("request"),
        answer_bytes_in_kernel: bytes_share("answer"),
        pool_counters,
    })
}

/// `after - before`, field by field (a field new in `after` counts from 0).
fn differences(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(field, &end)| (field.clone(), end.saturating_sub(before.get(field).copied().unwrap_or(0))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PROG_SHOW: &str = r#"[
        {"id":7,"type":"sk_skb","name":"fp_client","run_time_ns":5000,"run_cnt":10},
        {"id":8,"type":"sk_skb","name":"fp_server","run_time_ns":9000,"run_cnt":30},
        {"id":9,"type":"sk_skb","name":"fp_client","run_time_ns":1,"run_cnt":1},
        {"id":3,"type":"cgroup_skb","name":"other","run_time_ns":1,"run_cnt":1},
        {"id":10,"type":"sk_skb","name":"fp_server"}
    ]"#;

    /// What a pooler holding programs 7, 8, 3 and maps 6, 8 would show in its fdinfo.
    fn ours() -> Owned {
        let mut owned = Owned::default();
        for fdinfo in ["pos:\t0\nprog_type:\t14\nprog_id:\t7\nrun_time_ns:\t5000\n", "prog_id:\t8\n", "prog_id: 3\n"] {
            add_fdinfo_ids(fdinfo, &mut owned);
        }
        add_fdinfo_ids("pos:\t0\nmap_type:\t6\nmap_id:\t6\nfrozen:\t0\n", &mut owned);
        add_fdinfo_ids("map_id:\t8\n", &mut owned);
        add_fdinfo_ids("pos:\t0\nflags:\t02\n", &mut owned);
        owned
    }

    // Goal: fdinfo lines give program and map ids in separate sets; method: literal fdinfo,
    // and this test process, which holds no BPF object.
    #[test]
    fn fdinfo_ids_are_collected() {
        assert_eq!(ours(), Owned { program_ids: vec![7, 8, 3], map_ids: vec![6, 8] });
        assert!(owned_ids(&[std::process::id()]).program_ids.is_empty());
    }

    // Goal: only the fast-path programs our pooler holds are read; method: bpftool JSON with a
    // foreign fp_client, an unrelated program and one we do not hold.
    #[test]
    fn programs_are_filtered_by_name_and_owner() {
        let programs = parse_programs(PROG_SHOW, &ours()).expect("parse");
        let ids: Vec<(String, u64)> = programs.iter().map(|p| (p.name.clone(), p.id)).collect();
        assert_eq!(ids, vec![("fp_client".to_string(), 7), ("fp_server".to_string(), 8)]);
        assert_eq!((programs[1].run_time_ns, programs[1].run_count), (9000, 30));
        assert!(parse_programs(PROG_SHOW, &Owned::default()).expect("parse").is_empty());
        assert!(parse_programs("not json", &ours()).is_err());
    }

    // Goal: the counters map is found by name among the held maps (map ids are their own id
    // space: program 7 is not map 7) and summed over CPUs by field; method: literal
    // `map show` and `map dump` output of a two-CPU per-CPU array.
    #[test]
    fn counter_map_is_found_and_summed() {
        let show = r#"[{"id":5,"name":"fp_counters"},{"id":6,"name":"fp_counters"},{"id":7,"name":"fp_counters"}]"#;
        assert_eq!(parse_map_id(show, "fp_counters", &ours()).expect("parse"), Some(6));
        assert_eq!(parse_map_id(show, "fp_counters", &Owned::default()).expect("parse"), None);
        let dump = r#"[{"key":["0x00"],"values":[],"formatted":{"key":0,"values":[
            {"cpu":0,"value":{"transactions":10,"passes_slow":1}},
            {"cpu":1,"value":{"transactions":5,"passes_slow":0}}]}}]"#;
        let sums = parse_percpu_sum(dump).expect("parse");
        assert_eq!(sums.get("transactions"), Some(&15));
        assert_eq!(sums.get("passes_slow"), Some(&1));
    }

    // Goal: statistics can be switched on by two holders at once (the kernel counts holders,
    // so a benchmark never undoes someone else's); method: enable twice as root (CI runs as
    // root) and check both descriptors are open. The sysctl cannot show this: it reports only
    // its own setting, not the descriptors.
    #[test]
    fn stats_switch_is_reference_counted() {
        use std::os::fd::AsRawFd;
        let first = StatsSwitch::enable().expect("BPF_ENABLE_STATS (run as root)");
        let second = StatsSwitch::enable().expect("a second holder");
        for switch in [&first, &second] {
            // SAFETY: fcntl(F_GETFD) on a descriptor we own has no memory effects.
            let flags = unsafe { libc::fcntl(switch._descriptor.as_raw_fd(), libc::F_GETFD) };
            assert!(flags >= 0, "descriptor closed");
        }
        assert_ne!(first._descriptor.as_raw_fd(), second._descriptor.as_raw_fd());
    }

    // Goal: ns per verdict and per transaction come from the differences of the same program
    // ids; method: two samples, one program new in the second.
    #[test]
    fn cost_divides_differences() {
        let program = |name: &str, id, run_time_ns, run_count| ProgramCounters {
            name: name.to_string(),
            id,
            run_time_ns,
            run_count,
        };
        let bytes = |requests: [u64; 2], answers: [u64; 2]| {
            BTreeMap::from([
                ("request_bytes_forwarded".to_string(), requests[0]),
                ("request_bytes_passed".to_string(), requests[1]),
                ("answer_bytes_forwarded".to_string(), answers[0]),
                ("answer_bytes_passed".to_string(), answers[1]),
            ])
        };
        let before = Sample {
            programs: vec![program("fp_client", 7, 1_000, 10)],
            kernel_counters: BTreeMap::from([("transactions".to_string(), 100)]),
            pool_counters: bytes([100, 100], [0, 0]),
        };
        let after = Sample {
            programs: vec![program("fp_client", 7, 3_000, 20), program("fp_server", 8, 6_000, 30)],
            kernel_counters: BTreeMap::from([("transactions".to_string(), 150), ("passes_slow".to_string(), 2)]),
            pool_counters: bytes([190, 110], [990, 10]),
        };
        let cost = cost(&before, &after, 10).expect("cost");
        assert_eq!(cost.programs[0].ns_per_run, Some(200.0));
        assert_eq!(cost.programs[1].ns_per_run, Some(200.0));
        assert_eq!(cost.ns_per_txn, 800.0);
        assert_eq!(cost.verdicts_per_txn, 4.0);
        assert_eq!(cost.kernel_counters.get("transactions"), Some(&50));
        assert_eq!((cost.kernel_transaction_share, cost.passes_per_txn), (Some(5.0), Some(0.2)));
        assert_eq!((cost.request_bytes_in_kernel, cost.answer_bytes_in_kernel), (Some(0.9), Some(0.99)));
        assert_eq!(super::cost(&before, &after, 0), None);
        assert_eq!(super::cost(&before, &Sample::default(), 10), None);
    }
}
