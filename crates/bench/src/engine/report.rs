//! The benchmark's markdown and PNG.

use std::fmt::Write;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::alloc::WorkingSetResult;
use super::alloc_profile::Profile;
use super::tpch::EngineTimes;
use super::{Cell, Results, Section};
use crate::report::plot::{plot_error, register_font};
use bypass_engine::runtime::RuntimeKind;

/// The cell of one runtime without SCHED_FIFO (the seed's two-way comparison).
fn find(cells: &[Cell], runtime: RuntimeKind, columns: usize, rows: usize) -> Option<&Cell> {
    cells.iter().find(|c| c.runtime == runtime && !c.sched_fifo && c.columns == columns && c.rows_per_chunk == rows)
}

/// Names the `--only` run a section came from, so its load is not read off the report's header.
fn separate_run_line(out: &mut String, results: &Results, section: Section) {
    if let Some(run) = results.separate_runs.get(&section) {
        let _ = writeln!(
            out,
            "Measured separately from the other sections: `{}`, load average before `{}`, after `{}`.\n",
            run.command, run.load_average_before, run.load_average_after
        );
    }
}

fn nautdb_markdown(out: &mut String, results: &Results) {
    let cells = &results.nautdb;
    if cells.is_empty() {
        return;
    }
    let trials = cells[0].trials.len();
    let _ = writeln!(out, "## 1. The seed's experiment (NautDB Figures 2 and 3)\n");
    let _ = writeln!(
        out,
        "256 chunks of uint32 columns, values in 0..100; create, row-oriented sort, column-oriented sort (counting \
         sort per chunk), select (`c0 = 42`, all columns materialized), free. {trials} trials per cell, rotating \
         runtimes; medians in ms, CV = coefficient of variation, faults = minor page faults per trial. Ratio = \
         plain / specialized (> 1: specialized faster). 2-core machine.\n"
    );
    separate_run_line(out, results, Section::Nautdb);
    let _ = writeln!(out, "| columns | rows/chunk | row sort spec | row sort plain | ratio | CV spec | CV plain | col sort spec | col sort plain | ratio | CV spec | CV plain | create ratio | select ratio | free ratio | faults spec | faults plain |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for s in cells.iter().filter(|c| c.runtime == RuntimeKind::Specialized && !c.sched_fifo) {
        let Some(p) = find(cells, RuntimeKind::Plain, s.columns, s.rows_per_chunk) else { continue };
        let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { 0.0 };
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} |",
            s.columns, s.rows_per_chunk, s.row_sort_ms.median, p.row_sort_ms.median, ratio(s.row_sort_ms.median, p.row_sort_ms.median),
            s.row_sort_ms.cv, p.row_sort_ms.cv, s.column_sort_ms.median, p.column_sort_ms.median,
            ratio(s.column_sort_ms.median, p.column_sort_ms.median), s.column_sort_ms.cv, p.column_sort_ms.cv,
            ratio(s.create_ms.median, p.create_ms.median), ratio(s.select_ms.median, p.select_ms.median),
            ratio(s.free_ms.median, p.free_ms.median), s.page_faults.median, p.page_faults.median,
        );
    }
    let _ = writeln!(out);
    fifo_markdown(out, cells);
}

/// Predictability with and without SCHED_FIFO: the same grid, the specialized runtime once
/// time-shared (pinned) and once under SCHED_FIFO, next to plain.
fn fifo_markdown(out: &mut String, cells: &[Cell]) {
    if !cells.iter().any(|c| c.sched_fifo) {
        return;
    }
    let _ = writeln!(out, "### Predictability: the specialized runtime with SCHED_FIFO (\"no time-sharing\")\n");
    let _ = writeln!(
        out,
        "The same cells, a third variant in the same rotation: specialized + SCHED_FIFO (priority 1, pinned to \
         the core the trial starts on; the kernel's RT throttling leaves other tasks 5% of that core). Medians in \
         ms and CV; ratio = plain / specialized+FIFO. 2-core machine shared with other engineers' builds.\n\n\
         Where the time-shared specialized runtime's variance comes from: its trial thread is pinned, so while \
         another process (another engineer's build) runs on that core the two share it, and the pinned thread \
         cannot move to the other core as the unpinned plain thread can; slow trials come in runs that match the \
         machine's load, on every variant that is time-shared. SCHED_FIFO takes the core for the trial (a \
         time-shared task there migrates), which is the seed's \"no time-sharing\". Our own sources are small: \
         no pool page faults after the warm-up trial (blocks are recycled), 400–700 minor faults per trial from \
         the heap-held chunk lists (< 1 ms), and the column sort's permutation now reuses one cache-warm arena \
         frame per chunk as the plain side reuses one heap buffer (it used to stream 8 MiB of fresh arena).\n"
    );
    let _ = writeln!(out, "| columns | rows/chunk | row sort fifo | ratio | CV row fifo | CV row spec | CV row plain | col sort fifo | ratio | CV col fifo | CV col spec | CV col plain |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|");
    for f in cells.iter().filter(|c| c.sched_fifo) {
        let (Some(s), Some(p)) = (
            find(cells, RuntimeKind::Specialized, f.columns, f.rows_per_chunk),
            find(cells, RuntimeKind::Plain, f.columns, f.rows_per_chunk),
        ) else {
            continue;
        };
        let ratio = |a: f64, b: f64| if a > 0.0 { b / a } else { 0.0 };
        let _ = writeln!(
            out,
            "| {} | {} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.3} | {:.3} | {:.3} |",
            f.columns,
            f.rows_per_chunk,
            f.row_sort_ms.median,
            ratio(f.row_sort_ms.median, p.row_sort_ms.median),
            f.row_sort_ms.cv,
            s.row_sort_ms.cv,
            p.row_sort_ms.cv,
            f.column_sort_ms.median,
            ratio(f.column_sort_ms.median, p.column_sort_ms.median),
            f.column_sort_ms.cv,
            s.column_sort_ms.cv,
            p.column_sort_ms.cv,
        );
    }
    let _ = writeln!(out);
}

fn allocator_markdown(out: &mut String, results: &Results, profile: Option<&Profile>) {
    if results.allocator.is_empty() {
        return;
    }
    let rounds = results.allocator[0].rounds;
    let _ = writeln!(out, "## 2. Allocators (the seed's Figure 1)\n");
    let _ = writeln!(
        out,
        "n objects of one size allocated, one byte of each touched (a volatile store), freed in allocation order; \
         median ns per object of {rounds} interleaved rounds; sizes passed through `black_box`; glibc through \
         `libc::malloc`/`free`, mimalloc through its `GlobalAlloc`, the arena is the runtime's worker arena \
         (`bypass_engine::arena`: a frame per batch, an allocation is a compare and an add). **floor** = the same touches \
         with no allocator: the arena's own addresses (same stride, batch and store) written from its pre-faulted \
         mapping. Every server is timed once it has settled (untimed rounds until three in a row agree within 5 %, at \
         most 16: after another server's traffic a streaming block's lines come back into the caches over several \
         passes); the \
         floor and the arena, which write the same lines, are timed as one block of 8 passes in Thue–Morse order, \
         F A A F A F F A, which gives both the same share of any drift left; **arena − floor** is what the arena adds to the touches (the median of the per-round differences, \
         which can differ from the difference of the medians where rounds drift, as streaming ones do), and \
         **(glibc − floor) ÷ (arena − floor)** compares the allocators' own costs (left out when arena − floor is \
         within noise: 2 × the median deviation of the per-round arena − floor, at least 5 % of the floor). The working set \
         decides what the touch costs: *streaming* keeps all n live (16 MiB and more, past the 2 MiB L2), so \
         each touch of a new line is a fill from L3 or DRAM; *L2-resident* frees every 256 KiB (objects ≥ 64 B still fill a line from L2 on their \
         touch); *L1-resident* frees every 32 KiB, about one morsel's scratch in the compiled tier, which is how the \
         engine uses its arena. 2-core machine.\n"
    );
    separate_run_line(out, results, Section::Allocators);
    for (index, set) in super::alloc::WORKING_SETS.iter().enumerate() {
        allocator_table(out, results, index, &set.name);
    }
    let _ = writeln!(out, "{}\n", target_verdict(results));
    let _ = writeln!(out, "{}\n", above_floor_verdict(results));
    if let Some(profile) = profile {
        profile_markdown(out, results, profile);
    }
}

fn allocator_table(out: &mut String, results: &Results, index: usize, name: &str) {
    let _ = writeln!(out, "**{name}**\n");
    let _ = writeln!(
        out,
        "| size | objects | live at once | floor | arena | mimalloc | glibc | glibc ÷ arena | mimalloc ÷ arena | arena − floor | (glibc − floor) ÷ (arena − floor) |"
    );
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &results.allocator {
        let Some(w) = r.working_sets.get(index) else { continue };
        let above = match w.glibc_above_floor_ratio {
            Some(ratio) => format!("{ratio:.1}×"),
            None => "arena within noise of the floor".to_string(),
        };
        let _ = writeln!(
            out,
            "| {} B | {} | {} | {:.2} | {:.2} | {:.1} | {:.1} | {:.1}× | {:.1}× | {:+.2} | {above} |",
            r.size_bytes,
            r.objects,
            w.batch_objects,
            w.floor_ns,
            w.arena_ns,
            w.mimalloc_ns,
            w.glibc_ns,
            w.glibc_ns / w.arena_ns,
            w.mimalloc_ns / w.arena_ns,
            w.arena_above_floor_ns,
        );
    }
    let _ = writeln!(out);
}

/// The target, "glibc / arena ≥ 10× for objects ≤ 256 B", judged per working set.
fn target_verdict(results: &Results) -> String {
    let verdicts: Vec<String> = super::alloc::WORKING_SETS
        .iter()
        .enumerate()
        .map(|(index, set)| {
            let worst = small_objects(results, index).map(|w| w.glibc_ns / w.arena_ns).fold(f64::INFINITY, f64::min);
            let met = if worst >= 10.0 { "met" } else { "NOT met" };
            format!("{}: {met} (smallest ratio {worst:.1}×)", set.name)
        })
        .collect();
    format!("Target glibc / arena ≥ 10× for objects ≤ 256 B, wall clock — {}.", verdicts.join("; "))
}

/// The same target on the allocators' own costs, above the touch floor.
fn above_floor_verdict(results: &Results) -> String {
    let verdicts: Vec<String> = super::alloc::WORKING_SETS
        .iter()
        .enumerate()
        .map(|(index, set)| {
            let cases: Vec<&WorkingSetResult> = small_objects(results, index).collect();
            let within = cases.iter().filter(|w| w.glibc_above_floor_ratio.is_none()).count();
            let worst = cases.iter().filter_map(|w| w.glibc_above_floor_ratio).fold(f64::INFINITY, f64::min);
            let met = if worst >= 10.0 { "met" } else { "NOT met" };
            match within {
                n if n == cases.len() => format!("{}: met (arena within noise of the floor at every size)", set.name),
                0 => format!("{}: {met} (smallest ratio {worst:.1}×)", set.name),
                n => format!(
                    "{}: {met} (arena within noise of the floor at {n} sizes; smallest ratio elsewhere {worst:.1}×)",
                    set.name
                ),
            }
        })
        .collect();
    format!(
        "Same target on the allocators' own cost, (glibc − floor) ÷ (arena − floor) ≥ 10× — {}.",
        verdicts.join("; ")
    )
}

/// Results of objects ≤ 256 B (the target) in one working set.
fn small_objects(results: &Results, index: usize) -> impl Iterator<Item = &WorkingSetResult> {
    results.allocator.iter().filter(|r| r.size_bytes <= 256).filter_map(move |r| r.working_sets.get(index))
}

/// The cachegrind profile's per-object events, arena next to glibc (and the floor).
fn profile_markdown(out: &mut String, results: &Results, profile: &Profile) {
    let _ = writeln!(out, "### Why: the deterministic profile\n");
    let _ = writeln!(
        out,
        "cachegrind, per object in the steady state (`scripts/engine-alloc-profile.sh`, full tables in \
         `engine-alloc-profile.md`; D1 = this machine's 48 KiB L1d, LL = its 2 MiB L2, so an LL miss is a line from \
         L3 or DRAM). Ir = instructions, mw = write misses, m = read + write misses.\n"
    );
    let _ = writeln!(out, "| working set | size | Ir floor | Ir arena | Ir glibc | D1mw floor | D1mw arena | D1mw glibc | D1m glibc | LLmw floor | LLmw arena | LLmw glibc | LLm glibc |");
    let _ = writeln!(out, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for set in &super::alloc::WORKING_SETS {
        for size in super::alloc_profile::PROFILE_SIZES {
            let case = |server: &str| profile.case(server, size, &set.name);
            let (Some(floor), Some(arena), Some(glibc)) = (case("floor"), case("arena"), case("glibc")) else {
                continue;
            };
            let _ = writeln!(
                out,
                "| {} | {size} B | {:.1} | {:.1} | {:.1} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |",
                set.name,
                floor.instructions,
                arena.instructions,
                glibc.instructions,
                floor.d1_write_misses,
                arena.d1_write_misses,
                glibc.d1_write_misses,
                glibc.d1_write_misses + glibc.d1_read_misses,
                floor.ll_write_misses,
                arena.ll_write_misses,
                glibc.ll_write_misses,
                glibc.ll_write_misses + glibc.ll_read_misses,
            );
        }
    }
    let _ = writeln!(out);
    if let Some(reading) = profile_reading(results, profile) {
        let _ = writeln!(out, "{reading}\n");
    }
}

/// What the profile says about the wall-clock ratios: the arena's instructions and misses
/// against the floor's and glibc's, then, case by case, where the touch's line fill caps the
/// ratio (the arena within noise of the floor, so glibc ÷ arena ≈ glibc ÷ floor).
fn profile_reading(results: &Results, profile: &Profile) -> Option<String> {
    let range = |server: &str| -> (f64, f64) {
        let values = profile.cases.iter().filter(|c| c.server == server).map(|c| c.instructions);
        values.fold((f64::INFINITY, 0.0), |(low, high), v| (low.min(v), high.max(v)))
    };
    let ((floor_low, floor_high), (arena_low, arena_high), (glibc_low, glibc_high)) =
        (range("floor"), range("arena"), range("glibc"));
    let same_misses = profile.cases.iter().filter(|c| c.server == "arena").all(|arena| {
        profile.case("floor", arena.size_bytes, &arena.working_set).is_some_and(|floor| {
            (floor.d1_write_misses + floor.d1_read_misses - arena.d1_write_misses - arena.d1_read_misses).abs() < 0.01
                && (floor.ll_write_misses + floor.ll_read_misses - arena.ll_write_misses - arena.ll_read_misses).abs()
                    < 0.01
        })
    });
    let glibc = profile.case("glibc", 64, "L2-resident")?;
    let mut text = format!(
        "Reading. The arena runs {arena_low:.1}–{arena_high:.1} instructions per object (the floor, the store and its \
         loop alone, {floor_low:.1}–{floor_high:.1}; the arena adds a bounds check and an add), glibc \
         {glibc_low:.0}–{glibc_high:.0}; the arena {} the floor's cache misses, one L1 miss per line it \
         touches. glibc takes more (at 64 B from L2 {:.2} L1 misses per object against the arena's 1): its chunk is \
         the request plus an 8 B header rounded up to 16 B (80 B for 64 B), and it touches the chunk on malloc \
         (reading the header) and again on free (writing the free-list link). Where no line is filled \
         (L1-resident) the wall-clock ratio follows the instruction ratio.",
        if same_misses { "takes exactly" } else { "does NOT take exactly" },
        glibc.d1_write_misses + glibc.d1_read_misses,
    );
    let _ = write!(text, " {}", shortfall_reading(results));
    Some(text)
}

/// Each case ≤ 256 B where glibc ÷ arena falls short of 10×, with glibc ÷ floor (the ratio's
/// ceiling when the arena sits on the floor) and whether it does.
fn shortfall_reading(results: &Results) -> String {
    let mut cases = Vec::new();
    for (index, set) in super::alloc::WORKING_SETS.iter().enumerate() {
        for r in results.allocator.iter().filter(|r| r.size_bytes <= 256) {
            let Some(w) = r.working_sets.get(index) else { continue };
            if w.glibc_ns / w.arena_ns >= 10.0 {
                continue;
            }
            let arena = match w.glibc_above_floor_ratio {
                None => "arena within noise of the floor".to_string(),
                Some(ratio) => {
                    format!("arena {:+.2} ns above the floor, cost ratio {ratio:.1}×", w.arena_above_floor_ns)
                }
            };
            cases.push(format!(
                "{} {} B: glibc ÷ arena {:.1}×, glibc ÷ floor {:.1}×, {arena}",
                set.name,
                r.size_bytes,
                w.glibc_ns / w.arena_ns,
                w.glibc_ns / w.floor_ns
            ));
        }
    }
    if cases.is_empty() {
        return "glibc ÷ arena ≥ 10× in every case ≤ 256 B of this run.".to_string();
    }
    format!(
        "Short of 10× in this run — {}. Where the arena sits on the floor its time is the fill of the line the touch \
         writes, which every allocator pays and no allocator can go below, so glibc ÷ floor is, within noise, the \
         ceiling of the wall-clock ratio: the shortfall there is the memory system, not the arena.",
        cases.join("; ")
    )
}

fn mib(bytes: Option<u64>) -> Option<f64> {
    bytes.map(|b| b as f64 / (1u64 << 20) as f64)
}

fn tpch_markdown(out: &mut String, results: &Results) {
    let Some(tpch) = &results.tpch else { return };
    let _ = writeln!(out, "## 3. TPC-H SF {} in memory, {} threads\n", tpch.scale_factor, tpch.threads);
    let _ = writeln!(
        out,
        "Minimum of {} runs after a warm-up, ms; same generated rows for every engine (CSV → Arrow for the peers, \
         decimal128(15,2) and date32 there, scaled int64 and int32 days here); ✓ = same answer as bypass. 2-core machine.\n",
        tpch.runs
    );
    separate_run_line(out, results, Section::Tpch);
    let names: Vec<&String> = tpch.engines.keys().collect();
    let header: Vec<String> = names.iter().map(|n| format!("{n} {}", tpch.engines[*n].version)).collect();
    let _ = writeln!(out, "| query | {} | bypass / duckdb |", header.join(" | "));
    let _ = writeln!(out, "|---|{}---|", "---|".repeat(names.len()));
    for &q in &bypass_engine::tpch::SUPPORTED_QUERIES {
        let cells: Vec<String> = names
            .iter()
            .map(|n| match tpch.engines[*n].queries.get(&q) {
                Some(t) => match (t.min_ms, &t.error) {
                    (Some(ms), _) => format!(
                        "{ms:.1}{}",
                        if t.same_answer_as_bypass == Some(false) {
                            " ✗"
                        } else if t.same_answer_as_bypass == Some(true) {
                            " ✓"
                        } else {
                            ""
                        }
                    ),
                    (None, Some(e)) => format!("error: {}", e.chars().take(60).collect::<String>()),
                    _ => "–".into(),
                },
                None => "–".into(),
            })
            .collect();
        let ratio = match (
            tpch.engines.get("bypass").and_then(|e| e.queries[&q].min_ms),
            tpch.engines.get("duckdb").and_then(|e| e.queries.get(&q)).and_then(|t| t.min_ms),
        ) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "–".into(),
        };
        let _ = writeln!(out, "| Q{q} | {} | {ratio} |", cells.join(" | "));
    }
    let ratio_to_duckdb = |value: fn(&EngineTimes) -> Option<f64>| match (
        tpch.engines.get("bypass").and_then(value),
        tpch.engines.get("duckdb").and_then(value),
    ) {
        (Some(a), Some(b)) => format!("{:.2}", a / b),
        _ => "–".into(),
    };
    let row = |value: fn(&EngineTimes) -> Option<f64>, digits: usize| -> String {
        names
            .iter()
            .map(|n| value(&tpch.engines[*n]).map_or("–".into(), |v| format!("{v:.digits$}")))
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let _ = writeln!(
        out,
        "| geomean, queries all answered | {} | {} |",
        row(|e| e.geomean_ms, 1),
        ratio_to_duckdb(|e| e.geomean_ms)
    );
    let _ = writeln!(
        out,
        "| geomean, all 22 | {} | {} |",
        row(|e| e.geomean_all_ms, 1),
        ratio_to_duckdb(|e| e.geomean_all_ms)
    );
    let _ = writeln!(
        out,
        "| RSS after load, MiB | {} | {} |",
        row(|e| mib(e.rss_after_load_bytes), 0),
        ratio_to_duckdb(|e| mib(e.rss_after_load_bytes))
    );
    let _ = writeln!(
        out,
        "| peak RSS while querying, MiB | {} | {} |\n",
        row(|e| mib(e.peak_rss_queries_bytes), 0),
        ratio_to_duckdb(|e| mib(e.peak_rss_queries_bytes))
    );
    let _ = writeln!(
        out,
        "Memory is the whole process's resident set: each peer runs in a process of its own (Python with the \
         engine's library, about 100 MiB before any data; DuckDB's Arrow input freed after its copy is made), bypass \
         in the benchmark's process; the peak is reset once the tables are \
         loaded, so it is the tables plus the queries' working memory. – = the engine missed a query (error above).\n"
    );
}

pub fn markdown(results: &Results, profile: Option<&Profile>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# bypass bench engine\n");
    let _ = writeln!(out, "Command: `{}`  ", results.command);
    let m = &results.machine;
    let _ = writeln!(
        out,
        "Machine: {} (shared with other engineers' builds), load average before `{}`, after `{}`; THP `{}`, hugetlb pages {}.\n",
        m.headline(), m.load_average_before, m.load_average_after, m.transparent_hugepages, m.hugetlb_pages
    );
    nautdb_markdown(&mut out, results);
    allocator_markdown(&mut out, results, profile);
    tpch_markdown(&mut out, results);
    out
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn heat_map(area: &Area<'_>, cells: &[Cell]) -> anyhow::Result<()> {
    let columns: Vec<usize> =
        super::COLUMNS.iter().copied().filter(|c| cells.iter().any(|x| x.columns == *c)).collect();
    let rows_log2 = super::ROWS_LOG2;
    // Segmented axes put each label at the centre of its cell, not on the cell's left/lower edge.
    let mut chart = ChartBuilder::on(area)
        .caption("row sort: log10(plain / specialized)", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        // Discrete integer ranges include their end: one segment per column count and size.
        .build_cartesian_2d(
            (0..columns.len().saturating_sub(1)).into_segmented(),
            (*rows_log2.start()..*rows_log2.end()).into_segmented(),
        )
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(columns.len())
        .y_labels(rows_log2.clone().count())
        .x_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => columns.get(*i).map_or(String::new(), |c| format!("{c} cols")),
            _ => String::new(),
        })
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(log2) => format!("2^{log2}"),
            _ => String::new(),
        })
        .y_desc("rows per chunk")
        .draw()
        .map_err(plot_error)?;
    let centred = TextStyle::from(("sans-serif", 14)).pos(Pos::new(HPos::Center, VPos::Center));
    for (i, &c) in columns.iter().enumerate() {
        for log2 in rows_log2.clone() {
            let rows = 1usize << log2;
            let (Some(s), Some(p)) =
                (find(cells, RuntimeKind::Specialized, c, rows), find(cells, RuntimeKind::Plain, c, rows))
            else {
                continue;
            };
            let value = (p.row_sort_ms.median / s.row_sort_ms.median.max(1e-9)).log10();
            let strength = (value.abs() / 0.2).min(1.0);
            let shade = (255.0 * (1.0 - strength)) as u8;
            let color = if value >= 0.0 { RGBColor(shade, shade, 255) } else { RGBColor(255, shade, shade) };
            let corners = [
                (SegmentValue::Exact(i), SegmentValue::Exact(log2)),
                (SegmentValue::Exact(i + 1), SegmentValue::Exact(log2 + 1)),
            ];
            chart.draw_series(std::iter::once(Rectangle::new(corners, color.filled()))).map_err(plot_error)?;
            let centre = (SegmentValue::CenterOf(i), SegmentValue::CenterOf(log2));
            chart
                .draw_series(std::iter::once(Text::new(format!("{value:+.2}"), centre, centred.clone())))
                .map_err(plot_error)?;
        }
    }
    Ok(())
}

fn column_sort_lines(area: &Area<'_>, cells: &[Cell]) -> anyhow::Result<()> {
    let rows = cells.iter().map(|c| c.rows_per_chunk).max().unwrap_or(1);
    let series = |runtime: RuntimeKind| -> Vec<(f64, f64, f64)> {
        cells
            .iter()
            .filter(|c| c.runtime == runtime && !c.sched_fifo && c.rows_per_chunk == rows)
            .map(|c| ((c.columns as f64).log2(), c.column_sort_ms.median, c.column_sort_ms.cv * c.column_sort_ms.mean))
            .collect()
    };
    let (specialized, plain) = (series(RuntimeKind::Specialized), series(RuntimeKind::Plain));
    let top = specialized.iter().chain(&plain).map(|(_, m, s)| m + 5.0 * s).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("column sort, {rows} rows/chunk: median ± 5σ"), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0.5f64..7.5f64, 0f64..top * 1.05)
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("log2 columns").y_desc("ms").draw().map_err(plot_error)?;
    for (points, color, name) in [(&specialized, BLUE, "specialized"), (&plain, RED, "plain")] {
        chart
            .draw_series(LineSeries::new(points.iter().map(|(x, m, _)| (*x, *m)), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(
                points.iter().map(|(x, m, s)| {
                    PathElement::new(vec![(*x, m - 5.0 * s), (*x, m + 5.0 * s)], color.stroke_width(3))
                }),
            )
            .map_err(plot_error)?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(plot_error)?;
    Ok(())
}

fn allocator_lines(area: &Area<'_>, results: &Results) -> anyhow::Result<()> {
    let rows = &results.allocator;
    let top =
        rows.iter().flat_map(|r| r.working_sets.iter().map(|w| w.glibc_ns.max(w.mimalloc_ns))).fold(10.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption("allocation: ns per object", ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(3f64..26f64, (0.1f64..top * 2.0).log_scale())
        .map_err(plot_error)?;
    chart.configure_mesh().x_desc("log2 object size (bytes)").y_desc("ns (log)").draw().map_err(plot_error)?;
    type Series = (&'static str, [RGBColor; 3], fn(&super::alloc::WorkingSetResult) -> f64);
    // One hue per allocator (grey for the touch floor), darker for the more cache-resident
    // working sets.
    let lines: [Series; 4] = [
        ("floor", [RGBColor(190, 190, 190), RGBColor(130, 130, 130), RGBColor(60, 60, 60)], |w| w.floor_ns),
        ("arena", [RGBColor(120, 160, 255), RGBColor(40, 90, 230), RGBColor(0, 20, 140)], |w| w.arena_ns),
        ("mimalloc", [RGBColor(140, 220, 120), RGBColor(50, 160, 40), RGBColor(0, 90, 0)], |w| w.mimalloc_ns),
        ("glibc", [RGBColor(255, 150, 150), RGBColor(220, 40, 40), RGBColor(130, 0, 0)], |w| w.glibc_ns),
    ];
    for (name, colors, value) in lines {
        for (index, set) in super::alloc::WORKING_SETS.iter().enumerate() {
            let color = colors[index % colors.len()];
            let points: Vec<(f64, f64)> = rows
                .iter()
                .filter_map(|r| r.working_sets.get(index).map(|w| ((r.size_bytes as f64).log2(), value(w).max(0.1))))
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(plot_error)?
                .label(format!("{name}, {}", set.name))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled()))).map_err(plot_error)?;
        }
    }
    // Twelve entries: the upper left is the one corner no line reaches.
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

fn tpch_bars(area: &Area<'_>, results: &Results) -> anyhow::Result<()> {
    let Some(tpch) = &results.tpch else { return Ok(()) };
    let engines: Vec<&String> = tpch.engines.keys().collect();
    let queries = bypass_engine::tpch::SUPPORTED_QUERIES;
    let top = tpch.engines.values().flat_map(|e| e.queries.values().filter_map(|q| q.min_ms)).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("TPC-H SF {} ({} threads): min ms", tpch.scale_factor, tpch.threads), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        // Query i's bars are centred on x = i, where the integer ticks and their labels fall.
        .build_cartesian_2d(-0.5f64..queries.len() as f64 - 0.5, (0.5f64..top * 2.0).log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_labels(queries.len())
        .x_label_formatter(&|x| {
            let index = x.round();
            let on_tick = (x - index).abs() < 1e-6 && index >= 0.0;
            on_tick.then(|| queries.get(index as usize).map(|q| format!("Q{q}"))).flatten().unwrap_or_default()
        })
        .y_desc("ms (log)")
        .draw()
        .map_err(plot_error)?;
    let palette = [BLUE, RED, GREEN, MAGENTA, CYAN];
    let width = 0.8 / engines.len().max(1) as f64;
    for (e, name) in engines.iter().enumerate() {
        let color = palette[e % palette.len()];
        let bars: Vec<Rectangle<(f64, f64)>> = queries
            .iter()
            .enumerate()
            .filter_map(|(i, q)| tpch.engines[*name].queries.get(q).and_then(|t| t.min_ms).map(|ms| (i, ms)))
            .map(|(i, ms)| {
                let x = i as f64 - 0.4 + e as f64 * width;
                Rectangle::new([(x, 0.5), (x + width, ms)], color.filled())
            })
            .collect();
        chart
            .draw_series(bars)
            .map_err(plot_error)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(plot_error)?;
    Ok(())
}

pub fn plot(results: &Results, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1600, 1200)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let panels = root.split_evenly((2, 2));
    if !results.nautdb.is_empty() {
        heat_map(&panels[0], &results.nautdb)?;
        column_sort_lines(&panels[1], &results.nautdb)?;
    }
    allocator_lines(&panels[2], results)?;
    tpch_bars(&panels[3], results)?;
    root.present().map_err(plot_error)?;
    Ok(())
}
