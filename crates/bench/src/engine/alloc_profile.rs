//! A deterministic profile of the allocator benchmark: each (server, size, working set) runs
//! under cachegrind, which counts instructions and simulated cache misses exactly, so the
//! wall-clock ratios of [`super::alloc`] get a reason that machine noise cannot move.
//!
//! ```text
//!   for server × size × working set:
//!     valgrind --tool=cachegrind <worker> round … --rounds 1  ─┐  summary line of each
//!     valgrind --tool=cachegrind <worker> round … --rounds 3  ─┴► (3 rounds − 1 round) ÷ (2 × objects)
//! ```
//!
//! The difference of two runs cancels everything a run does once (start-up, mapping and
//! prefaulting the arena, the first round's heap growth), leaving the steady-state cost of one
//! object: the same loops [`super::alloc::Bench::round`] times. The simulated caches are this
//! machine's L1d (48 KiB, 12-way) and L2 (2 MiB, 16-way) as cachegrind's D1 and LL, so an LL
//! miss is a line that came from beyond L2. Cachegrind models write-allocate caches without
//! prefetchers and does not count write-backs.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use serde::{Deserialize, Serialize};

use super::alloc::{batch_objects, Server, SIZES, WORKING_SETS};

/// Object sizes the issue's target covers (≤ 256 B).
pub const PROFILE_SIZES: [usize; 3] = [16, 64, 256];
/// Servers profiled, in report order.
pub const PROFILE_SERVERS: [Server; 4] = [Server::Floor, Server::Arena, Server::Mimalloc, Server::Glibc];
/// Rounds of the shorter and the longer run; their difference is the steady state.
const ROUNDS_SHORT: usize = 1;
const ROUNDS_LONG: usize = 3;
/// cachegrind's cache model: `size,associativity,line` in bytes (this machine's L1d and L2).
const D1_MODEL: &str = "49152,12,64";
const LL_MODEL: &str = "2097152,16,64";

/// Totals from one cachegrind run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    pub instructions: u64,
    pub d1_read_misses: u64,
    pub d1_write_misses: u64,
    pub ll_read_misses: u64,
    pub ll_write_misses: u64,
}

/// Steady-state events per object of one (server, size, working set).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileCase {
    pub server: String,
    pub size_bytes: usize,
    pub working_set: String,
    pub batch_objects: usize,
    pub instructions: f64,
    pub d1_read_misses: f64,
    pub d1_write_misses: f64,
    pub ll_read_misses: f64,
    pub ll_write_misses: f64,
}

/// The whole profile, as written to `engine-alloc-profile.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    pub command: String,
    pub valgrind: String,
    pub d1_model: String,
    pub ll_model: String,
    pub cases: Vec<ProfileCase>,
}

impl Profile {
    /// The case of one server, size and working set.
    pub fn case(&self, server: &str, size_bytes: usize, working_set: &str) -> Option<&ProfileCase> {
        self.cases.iter().find(|c| c.server == server && c.size_bytes == size_bytes && c.working_set == working_set)
    }
}

/// A server's name as the worker's `--server` flag spells it.
pub fn server_name(server: Server) -> &'static str {
    match server {
        Server::Floor => "floor",
        Server::Arena => "arena",
        Server::Mimalloc => "mimalloc",
        Server::Glibc => "glibc",
    }
}

/// Objects per round for a profiled size (the benchmark's own count).
pub fn objects_for(size: usize) -> anyhow::Result<usize> {
    SIZES
        .iter()
        .find(|(s, _)| *s == size)
        .map(|(_, objects)| *objects)
        .ok_or_else(|| anyhow::anyhow!("{size} B is not one of the benchmark's sizes"))
}

/// Reads the `events:` and `summary:` lines of a cachegrind output file.
pub fn parse_cachegrind(text: &str) -> anyhow::Result<Counts> {
    let line = |prefix: &str| -> anyhow::Result<Vec<&str>> {
        let found = text.lines().find_map(|l| l.strip_prefix(prefix));
        Ok(found
            .ok_or_else(|| anyhow::anyhow!("cachegrind output has no `{prefix}` line"))?
            .split_whitespace()
            .collect())
    };
    let (events, values) = (line("events:")?, line("summary:")?);
    anyhow::ensure!(events.len() == values.len(), "cachegrind: {} events but {} values", events.len(), values.len());
    let value = |name: &str| -> anyhow::Result<u64> {
        let index = events.iter().position(|e| *e == name).ok_or_else(|| {
            anyhow::anyhow!("cachegrind output lacks event {name} (cache simulation off? pass --cache-sim=yes)")
        })?;
        values[index].parse().map_err(|e| anyhow::anyhow!("cachegrind {name} = {:?}: {e}", values[index]))
    };
    Ok(Counts {
        instructions: value("Ir")?,
        d1_read_misses: value("D1mr")?,
        d1_write_misses: value("D1mw")?,
        ll_read_misses: value("DLmr")?,
        ll_write_misses: value("DLmw")?,
    })
}

/// Runs the worker once under cachegrind and returns its totals.
fn cachegrind(worker: &Path, server: Server, size: usize, working_set: &str, rounds: usize) -> anyhow::Result<Counts> {
    let out = tempfile::NamedTempFile::new()?;
    // The worker's own output (its round times, meaningless under valgrind) is kept for errors.
    let output = Command::new("valgrind")
        .args(["--tool=cachegrind", "--cache-sim=yes", "--branch-sim=no", "--I1=32768,8,64"])
        .arg(format!("--D1={D1_MODEL}"))
        .arg(format!("--LL={LL_MODEL}"))
        .arg(format!("--cachegrind-out-file={}", out.path().display()))
        .arg("--log-file=/dev/null")
        .arg(worker)
        .args(["round", "--server", server_name(server), "--working-set", working_set])
        .args(["--size", &size.to_string(), "--rounds", &rounds.to_string()])
        .output()
        .map_err(|e| anyhow::anyhow!("valgrind: {e} (apt-get install -y valgrind)"))?;
    anyhow::ensure!(
        output.status.success(),
        "valgrind on {} {size} B {working_set} exited with {}: {}",
        server_name(server),
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    parse_cachegrind(&std::fs::read_to_string(out.path())?)
}

/// Steady-state events per object: (long run − short run) ÷ objects of the extra rounds.
fn per_object(short: Counts, long: Counts, objects: usize) -> [f64; 5] {
    let extra = ((ROUNDS_LONG - ROUNDS_SHORT) * objects) as f64;
    let per = |long: u64, short: u64| (long as f64 - short as f64) / extra;
    [
        per(long.instructions, short.instructions),
        per(long.d1_read_misses, short.d1_read_misses),
        per(long.d1_write_misses, short.d1_write_misses),
        per(long.ll_read_misses, short.ll_read_misses),
        per(long.ll_write_misses, short.ll_write_misses),
    ]
}

/// Profiles every server × [`PROFILE_SIZES`] × working set with `worker` (this crate's
/// `alloc_profile` example, which runs one server's rounds).
pub fn profile(worker: &Path) -> anyhow::Result<Profile> {
    let mut cases = Vec::new();
    for set in &WORKING_SETS {
        for size in PROFILE_SIZES {
            let objects = objects_for(size)?;
            for server in PROFILE_SERVERS {
                let short = cachegrind(worker, server, size, &set.name, ROUNDS_SHORT)?;
                let long = cachegrind(worker, server, size, &set.name, ROUNDS_LONG)?;
                let [instructions, d1_read_misses, d1_write_misses, ll_read_misses, ll_write_misses] =
                    per_object(short, long, objects);
                eprintln!("{:>8} {size:>3} B {:<11}: {instructions:.1} Ir/object", server_name(server), set.name);
                cases.push(ProfileCase {
                    server: server_name(server).to_string(),
                    size_bytes: size,
                    working_set: set.name.to_string(),
                    batch_objects: batch_objects(size, objects, set.batch_bytes),
                    instructions,
                    d1_read_misses,
                    d1_write_misses,
                    ll_read_misses,
                    ll_write_misses,
                });
            }
        }
    }
    let version = Command::new("valgrind").arg("--version").output()?;
    Ok(Profile {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        valgrind: String::from_utf8_lossy(&version.stdout).trim().to_string(),
        d1_model: D1_MODEL.to_string(),
        ll_model: LL_MODEL.to_string(),
        cases,
    })
}

/// The profile as a markdown page: one table per working set.
pub fn markdown(profile: &Profile) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Allocator profile (cachegrind)\n");
    let _ = writeln!(out, "Command: `{}` ({}); D1 `{}`, LL `{}` (size, ways, line: this machine's L1d and L2, so an LL miss is a line from L3 or DRAM).\n", profile.command, profile.valgrind, profile.d1_model, profile.ll_model);
    let _ = writeln!(
        out,
        "Events per object in the steady state: (a run of {ROUNDS_LONG} rounds − a run of {ROUNDS_SHORT}) ÷ the \
         objects of the extra rounds, for the same loops `bypass bench engine` times (one byte touched per object; \
         floor = the arena's addresses with no allocator). Ir = instructions, D1mw / LLmw = write misses, D1mr / \
         LLmr = read misses. cachegrind simulates the caches (write-allocate, no prefetchers, write-backs not \
         counted), so these figures do not depend on the machine's load; two runs agree to three digits (only \
         the address layout moves a few events).\n"
    );
    for set in &WORKING_SETS {
        let _ = writeln!(out, "**{}**\n", set.name);
        let _ = writeln!(out, "| size | server | live at once | Ir | D1mw | LLmw | D1mr | LLmr |");
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for case in profile.cases.iter().filter(|c| c.working_set == set.name) {
            let _ = writeln!(
                out,
                "| {} B | {} | {} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} |",
                case.size_bytes,
                case.server,
                case.batch_objects,
                case.instructions,
                case.d1_write_misses,
                case.ll_write_misses,
                case.d1_read_misses,
                case.ll_read_misses
            );
        }
        let _ = writeln!(out);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    // Goal: the totals come from the summary line, matched to the events by name, and a run
    // without cache simulation is a clear error; method: parse cachegrind 3.19-shaped text.
    #[test]
    fn cachegrind_summaries_are_read_by_event_name() {
        let text = "desc: I1 cache: 32768 B, 64 B, 8-way associative\ncmd: worker round\n\
                    events: Ir I1mr ILmr Dr D1mr DLmr Dw D1mw DLmw\nfl=x.rs\n\
                    summary: 1000 2 3 400 5 6 300 70 8\n";
        let counts = parse_cachegrind(text).expect("a well-formed summary");
        let expected = Counts {
            instructions: 1000,
            d1_read_misses: 5,
            d1_write_misses: 70,
            ll_read_misses: 6,
            ll_write_misses: 8,
        };
        assert_eq!(counts, expected);
        let without_cache_simulation = "events: Ir\nsummary: 1000\n";
        let error = parse_cachegrind(without_cache_simulation).expect_err("no miss events");
        assert!(error.to_string().contains("D1mr"), "{error}");
        assert!(parse_cachegrind("events: Ir D1mr\n").is_err(), "no summary line");
    }

    // Goal: the steady state is the difference of the two runs per extra object, so one-time
    // costs cancel; method: two runs that share a start-up cost of 10^6 events.
    #[test]
    fn per_object_counts_cancel_one_time_costs() {
        let objects = 1000;
        let run = |rounds: u64| Counts {
            instructions: 1_000_000 + rounds * objects * 7,
            d1_write_misses: 1_000_000 + rounds * objects / 4,
            ..Counts::default()
        };
        let [instructions, _, d1_write_misses, _, _] =
            per_object(run(ROUNDS_SHORT as u64), run(ROUNDS_LONG as u64), objects as usize);
        assert_eq!(instructions, 7.0);
        assert_eq!(d1_write_misses, 0.25);
    }
}
