//! The benchmark's markdown and PNG.

use std::fmt::Write;
use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::FontStyle;

use super::{Cell, Results};
use crate::runtime::RuntimeKind;

const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The cell of one runtime without SCHED_FIFO (the seed's two-way comparison).
fn find(cells: &[Cell], runtime: RuntimeKind, columns: usize, rows: usize) -> Option<&Cell> {
    cells.iter().find(|c| c.runtime == runtime && !c.sched_fifo && c.columns == columns && c.rows_per_chunk == rows)
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

fn allocator_markdown(out: &mut String, results: &Results) {
    if results.allocator.is_empty() {
        return;
    }
    let _ = writeln!(out, "## 2. Allocators (the seed's Figure 1)\n");
    let _ = writeln!(
        out,
        "n objects of one size allocated, one byte of each touched (a volatile store), freed in allocation order; \
         median ns per object of 10 interleaved rounds; sizes passed through `black_box`; glibc through \
         `libc::malloc`/`free`, mimalloc through its `GlobalAlloc`, the arena is the runtime's worker arena \
         (`crate::arena`: a frame per batch, an allocation is a compare and an add). The working set decides what \
         the touch costs: *streaming* keeps all n live, so each touch of a new line is a DRAM write-allocation \
         that every allocator pays alike (it dominates the arena's figure; a ratio there says more about the \
         memory system than the allocator); *L2-resident* frees every 256 KiB (objects ≥ 64 B still fill a line \
         from L2 on their touch); *L1-resident* frees every 32 KiB, about one morsel's scratch in the compiled \
         tier, which is how the engine uses its arena. 2-core machine.\n"
    );
    for (index, set) in super::alloc::WORKING_SETS.iter().enumerate() {
        let _ = writeln!(out, "**{}**\n", set.name);
        let _ = writeln!(
            out,
            "| size | objects | live at once | arena | mimalloc | glibc | glibc / arena | mimalloc / arena |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|---|---|");
        for r in &results.allocator {
            let Some(w) = r.working_sets.get(index) else { continue };
            let _ = writeln!(
                out,
                "| {} B | {} | {} | {:.2} | {:.1} | {:.1} | {:.1}× | {:.1}× |",
                r.size_bytes,
                r.objects,
                w.batch_objects,
                w.arena_ns,
                w.mimalloc_ns,
                w.glibc_ns,
                w.glibc_ns / w.arena_ns,
                w.mimalloc_ns / w.arena_ns
            );
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "{}\n", target_verdict(results));
}

/// The target, "glibc / arena ≥ 10× for objects ≤ 256 B", judged per working set.
fn target_verdict(results: &Results) -> String {
    let verdicts: Vec<String> = super::alloc::WORKING_SETS
        .iter()
        .enumerate()
        .map(|(index, set)| {
            let ratios: Vec<f64> = results
                .allocator
                .iter()
                .filter(|r| r.size_bytes <= 256)
                .filter_map(|r| r.working_sets.get(index).map(|w| w.glibc_ns / w.arena_ns))
                .collect();
            let worst = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let met = if worst >= 10.0 { "met" } else { "NOT met" };
            format!("{}: {met} (smallest ratio {worst:.1}×)", set.name)
        })
        .collect();
    format!("Target glibc / arena ≥ 10× for objects ≤ 256 B — {}.", verdicts.join("; "))
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
    let names: Vec<&String> = tpch.engines.keys().collect();
    let header: Vec<String> = names.iter().map(|n| format!("{n} {}", tpch.engines[*n].version)).collect();
    let _ = writeln!(out, "| query | {} | bypass / duckdb |", header.join(" | "));
    let _ = writeln!(out, "|---|{}---|", "---|".repeat(names.len()));
    for &q in &crate::tpch::SUPPORTED_QUERIES {
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
    let geomeans: Vec<String> =
        names.iter().map(|n| tpch.engines[*n].geomean_ms.map_or("–".into(), |g| format!("{g:.1}"))).collect();
    let ratio = match (
        tpch.engines.get("bypass").and_then(|e| e.geomean_ms),
        tpch.engines.get("duckdb").and_then(|e| e.geomean_ms),
    ) {
        (Some(a), Some(b)) => format!("{:.2}", a / b),
        _ => "–".into(),
    };
    let _ = writeln!(out, "| geomean | {} | {ratio} |\n", geomeans.join(" | "));
}

pub fn markdown(results: &Results) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# bypass bench engine\n");
    let _ = writeln!(out, "Command: `{}`  ", results.command);
    let m = &results.machine;
    let _ = writeln!(
        out,
        "Machine: {} cores (2-core machine, shared with other engineers' builds), kernel {}, load average before `{}`, after `{}`; THP `{}`, hugetlb pages {}.\n",
        m.cores, m.kernel, m.load_average_before, m.load_average_after, m.transparent_hugepages, m.hugetlb_pages
    );
    nautdb_markdown(&mut out, results);
    allocator_markdown(&mut out, results);
    tpch_markdown(&mut out, results);
    out
}

fn register_font() -> anyhow::Result<()> {
    let bytes =
        std::fs::read(FONT_PATH).map_err(|e| anyhow::anyhow!("{FONT_PATH}: {e} (install fonts-dejavu-core)"))?;
    // Registered once per process; plotters keeps the bytes for the process lifetime.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
        .map_err(|_| anyhow::anyhow!("invalid font {FONT_PATH}"))
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_error(e: impl std::fmt::Display) -> anyhow::Error {
    anyhow::anyhow!("drawing: {e}")
}

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
        .map_err(draw_error)?;
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
        .map_err(draw_error)?;
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
            chart.draw_series(std::iter::once(Rectangle::new(corners, color.filled()))).map_err(draw_error)?;
            let centre = (SegmentValue::CenterOf(i), SegmentValue::CenterOf(log2));
            chart
                .draw_series(std::iter::once(Text::new(format!("{value:+.2}"), centre, centred.clone())))
                .map_err(draw_error)?;
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
        .map_err(draw_error)?;
    chart.configure_mesh().x_desc("log2 columns").y_desc("ms").draw().map_err(draw_error)?;
    for (points, color, name) in [(&specialized, BLUE, "specialized"), (&plain, RED, "plain")] {
        chart
            .draw_series(LineSeries::new(points.iter().map(|(x, m, _)| (*x, *m)), color.stroke_width(2)))
            .map_err(draw_error)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        chart
            .draw_series(
                points.iter().map(|(x, m, s)| {
                    PathElement::new(vec![(*x, m - 5.0 * s), (*x, m + 5.0 * s)], color.stroke_width(3))
                }),
            )
            .map_err(draw_error)?;
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(draw_error)?;
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
        .map_err(draw_error)?;
    chart.configure_mesh().x_desc("log2 object size (bytes)").y_desc("ns (log)").draw().map_err(draw_error)?;
    type Series = (&'static str, [RGBColor; 3], fn(&super::alloc::WorkingSetResult) -> f64);
    // One hue per allocator, darker for the more cache-resident working sets.
    let lines: [Series; 3] = [
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
                .map_err(draw_error)?
                .label(format!("{name}, {}", set.name))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|p| Circle::new(*p, 4, color.filled()))).map_err(draw_error)?;
        }
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(draw_error)?;
    Ok(())
}

fn tpch_bars(area: &Area<'_>, results: &Results) -> anyhow::Result<()> {
    let Some(tpch) = &results.tpch else { return Ok(()) };
    let engines: Vec<&String> = tpch.engines.keys().collect();
    let queries = crate::tpch::SUPPORTED_QUERIES;
    let top = tpch.engines.values().flat_map(|e| e.queries.values().filter_map(|q| q.min_ms)).fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(area)
        .caption(format!("TPC-H SF {} ({} threads): min ms", tpch.scale_factor, tpch.threads), ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        // Query i's bars are centred on x = i, where the integer ticks and their labels fall.
        .build_cartesian_2d(-0.5f64..queries.len() as f64 - 0.5, (0.5f64..top * 2.0).log_scale())
        .map_err(draw_error)?;
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
        .map_err(draw_error)?;
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
            .map_err(draw_error)?
            .label(name.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart.configure_series_labels().border_style(BLACK).background_style(WHITE).draw().map_err(draw_error)?;
    Ok(())
}

pub fn plot(results: &Results, path: &Path) -> anyhow::Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1600, 1200)).into_drawing_area();
    root.fill(&WHITE).map_err(draw_error)?;
    let panels = root.split_evenly((2, 2));
    if !results.nautdb.is_empty() {
        heat_map(&panels[0], &results.nautdb)?;
        column_sort_lines(&panels[1], &results.nautdb)?;
    }
    allocator_lines(&panels[2], results)?;
    tpch_bars(&panels[3], results)?;
    root.present().map_err(draw_error)?;
    Ok(())
}
