//! The allocator benchmark under cachegrind (`scripts/engine-alloc-profile.sh` builds and runs
//! it): `alloc_profile report --out-dir bench/results` runs this binary's `round` under
//! valgrind for every server, size ≤ 256 B and working set and writes
//! `engine-alloc-profile.{json,md}`; `alloc_profile round …` is one such run.

// mimalloc is the global allocator (bypass-bench links bypass-engine with `global-mimalloc`);
// only the pointer lists use it here, the glibc rounds call libc::malloc directly.

use bypass_bench::engine::alloc::{Bench, Server, WORKING_SETS};
use bypass_bench::engine::alloc_profile;
use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Arguments {
    #[command(subcommand)]
    command: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Profile every case under cachegrind and write engine-alloc-profile.{json,md}.
    Report {
        #[arg(long, default_value = "bench/results")]
        out_dir: std::path::PathBuf,
    },
    /// Run `rounds` rounds of one server (what cachegrind measures) and print their times.
    Round {
        #[arg(long, value_enum)]
        server: Server,
        /// Object size in bytes (16, 64 or 256).
        #[arg(long)]
        size: usize,
        /// streaming, L2-resident or L1-resident.
        #[arg(long)]
        working_set: String,
        #[arg(long, default_value_t = 1)]
        rounds: usize,
    },
}

fn main() -> anyhow::Result<()> {
    match Arguments::parse().command {
        Mode::Report { out_dir } => {
            let profile = alloc_profile::profile(&std::env::current_exe()?)?;
            std::fs::create_dir_all(&out_dir)?;
            std::fs::write(out_dir.join("engine-alloc-profile.json"), serde_json::to_string_pretty(&profile)?)?;
            std::fs::write(out_dir.join("engine-alloc-profile.md"), alloc_profile::markdown(&profile))?;
            println!("wrote {}/engine-alloc-profile.{{json,md}}", out_dir.display());
        }
        Mode::Round { server, size, working_set, rounds } => {
            let set = WORKING_SETS
                .iter()
                .find(|set| set.name == working_set)
                .ok_or_else(|| anyhow::anyhow!("unknown working set {working_set:?}"))?;
            let mut bench = Bench::new(size, alloc_profile::objects_for(size)?, set)?;
            // The times are printed for a quick look outside valgrind (under it they mean nothing).
            let times: Vec<String> = (0..rounds).map(|_| format!("{:.2}", bench.round(server))).collect();
            eprintln!("{server:?} {size} B {working_set}: ns per object by round {}", times.join(" "));
        }
    }
    Ok(())
}
