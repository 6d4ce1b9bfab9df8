//! `bypass fastpath status`: what of the fast path is loaded in the kernel right now, seen from
//! any process (root): the verdict programs (with `bpf_stats` run time), the maps, and the
//! per-CPU counters summed. Found by name, so it also reports a pooler started elsewhere.

use std::fmt::Write as _;

use aya::maps::{Map, MapData, PerCpuArray};

use crate::abi::{Counters, PoolCounters, POOLS_MAX};
use crate::{add_counters, FastPathError, Result};

/// Names of the objects `fastpath.bpf.c` creates (the kernel keeps 15 characters of a name).
const PROGRAM_NAMES: [&str; 2] = ["fp_client", "fp_server"];
const MAP_PREFIX: &str = "fp_";

/// One loaded verdict program.
#[derive(Debug, Clone)]
pub struct LoadedProgram {
    pub name: String,
    pub id: u32,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// One of the fast path's maps.
#[derive(Debug, Clone)]
pub struct LoadedMap {
    pub name: String,
    pub id: u32,
    pub kind: String,
    pub max_entries: u32,
}

/// Everything `status` found.
#[derive(Debug, Clone, Default)]
pub struct Status {
    pub programs: Vec<LoadedProgram>,
    pub maps: Vec<LoadedMap>,
    /// Summed per-CPU counters of every `fp_counters` map found (one per loaded pooler).
    pub counters: Option<Counters>,
    /// Every pool that moved bytes, in every `fp_pool_counts` map found (summed over CPUs).
    pub pools: Vec<PoolReport>,
}

/// Where one pool's bytes went. Pools are numbered per pooler (`map` tells poolers apart); the
/// pooler's own SHOW STATS and /metrics name them by database.
#[derive(Debug, Clone)]
pub struct PoolReport {
    pub map: u32,
    pub pool: u32,
    pub counters: PoolCounters,
}

/// Reads the kernel's view of every loaded fast path.
pub fn status() -> Result<Status> {
    let mut status = Status::default();
    for info in aya::programs::loaded_programs() {
        let info = info.map_err(|e| FastPathError::Load(e.to_string()))?;
        let name = info.name_as_str().unwrap_or_default().to_owned();
        if PROGRAM_NAMES.contains(&name.as_str()) {
            let (run_count, run_time_ns) = (info.run_count(), info.run_time().as_nanos() as u64);
            status.programs.push(LoadedProgram { name, id: info.id(), run_count, run_time_ns });
        }
    }
    for info in aya::maps::loaded_maps() {
        let info = info.map_err(|e| FastPathError::Map { map: "loaded maps", detail: e.to_string() })?;
        let name = info.name_as_str().unwrap_or_default().to_owned();
        if !name.starts_with(MAP_PREFIX) {
            continue;
        }
        let kind = info.map_type().map(|kind| format!("{kind:?}")).unwrap_or_else(|_| "unknown".into());
        // A pooler of another version (its counters have another layout) is listed, not read.
        let size = info.value_size() as usize;
        if name == "fp_pool_counts" && size == std::mem::size_of::<PoolCounters>() {
            status.pools.extend(read_pool_counters(info.id())?);
        }
        if name == "fp_counters" && size == std::mem::size_of::<Counters>() {
            let counters = read_counters(info.id())?;
            add_counters(status.counters.get_or_insert_with(Counters::default), &counters);
        }
        status.maps.push(LoadedMap { name, id: info.id(), kind, max_entries: info.max_entries() });
    }
    Ok(status)
}

fn read_counters(id: u32) -> Result<Counters> {
    let detail = |e: aya::maps::MapError| FastPathError::Map { map: "fp_counters", detail: e.to_string() };
    let array: PerCpuArray<MapData, Counters> =
        PerCpuArray::try_from(Map::PerCpuArray(MapData::from_id(id).map_err(detail)?)).map_err(detail)?;
    let mut total = Counters::default();
    for cpu in array.get(&0, 0).map_err(detail)?.iter() {
        add_counters(&mut total, cpu);
    }
    Ok(total)
}

fn read_pool_counters(id: u32) -> Result<Vec<PoolReport>> {
    let detail = |e: aya::maps::MapError| FastPathError::Map { map: "fp_pool_counts", detail: e.to_string() };
    let array: PerCpuArray<MapData, PoolCounters> =
        PerCpuArray::try_from(Map::PerCpuArray(MapData::from_id(id).map_err(detail)?)).map_err(detail)?;
    let mut pools = Vec::new();
    for pool in 0..POOLS_MAX {
        let mut counters = PoolCounters::default();
        for cpu in array.get(&pool, 0).map_err(detail)?.iter() {
            counters.add(cpu);
        }
        if counters != PoolCounters::default() {
            pools.push(PoolReport { map: id, pool, counters });
        }
    }
    Ok(pools)
}

/// One direction of a pool: bytes, messages and requests (or answers) forwarded in the kernel
/// and passed to user space, and the kernel's share of the bytes.
pub fn describe_direction(forwarded: [u64; 3], passed: [u64; 3], unit: &str) -> String {
    let total = forwarded[0] + passed[0];
    let share = match total {
        0 => "no bytes yet".to_owned(),
        _ => format!("{:.1}% of bytes in the kernel", 100.0 * forwarded[0] as f64 / total as f64),
    };
    format!(
        "forwarded in the kernel {} B / {} msgs / {} {unit}, passed to user space {} B / {} msgs / {} {unit} ({share})",
        forwarded[0], forwarded[1], forwarded[2], passed[0], passed[1], passed[2]
    )
}

impl Status {
    /// The report `bypass fastpath status` prints.
    pub fn render(&self) -> String {
        let mut text = String::new();
        if self.programs.is_empty() {
            text.push_str("fast path: not loaded (no fp_client/fp_server program in the kernel)\n");
            return text;
        }
        let _ = writeln!(text, "programs (run time counts while sysctl kernel.bpf_stats_enabled=1):");
        for p in &self.programs {
            let per_run = p.run_time_ns.checked_div(p.run_count).unwrap_or(0);
            let _ = writeln!(text, "  {:<10} id {:<6} runs {:>12}  {:>6} ns/run", p.name, p.id, p.run_count, per_run);
        }
        let _ = writeln!(text, "maps:");
        for m in &self.maps {
            let _ = writeln!(text, "  {:<12} id {:<6} {:<24} max_entries {}", m.name, m.id, m.kind, m.max_entries);
        }
        if let Some(c) = &self.counters {
            let _ = writeln!(text, "counters:\n  transactions released in the kernel {}", c.transactions);
            let _ = writeln!(text, "  verdicts: client {} server {}", c.client_runs, c.server_runs);
            let _ = writeln!(text, "  bytes: to servers {} to clients {}", c.bytes_to_servers, c.bytes_to_clients);
            let _ = writeln!(
                text,
                "  passes to user space: no server {} unsafe {} slow {} idle server {}",
                c.passes_no_server, c.passes_unsafe, c.passes_slow, c.passes_idle_server
            );
            let _ = writeln!(
                text,
                "  handoffs {} (without a wake-up {}) redirect failures {} passes announced to parked clients {}",
                c.handoffs, c.handoffs_quiet, c.redirect_failures, c.passes_announced
            );
            let _ = writeln!(
                text,
                "  queue behind: requests queued behind a busy server {} (queues broken {}), handed-off servers taken {}",
                c.queued, c.queue_broken, c.taken_from_handoff
            );
        }
        for p in &self.pools {
            let c = &p.counters;
            let _ = writeln!(
                text,
                "pool {} (map {}): {} transactions released in the kernel",
                p.pool, p.map, c.transactions
            );
            let requests = describe_direction(
                [c.request_bytes_forwarded, c.request_messages_forwarded, c.requests_forwarded],
                [c.request_bytes_passed, c.request_messages_passed, c.requests_passed],
                "requests",
            );
            let answers = describe_direction(
                [c.answer_bytes_forwarded, c.answer_messages_forwarded, c.answers_forwarded],
                [c.answer_bytes_passed, c.answer_messages_passed, c.answers_passed],
                "ReadyForQuery",
            );
            let _ = writeln!(text, "  requests (client to server): {requests}");
            let _ = writeln!(text, "  answers (server to client): {answers}");
        }
        text
    }
}
