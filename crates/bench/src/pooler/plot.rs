//! `pooler.png`: TPS (top row) and p99 latency (bottom row) against clients, one column per
//! workload, one line per contender. Rendered with plotters; text needs a TTF font, loaded at run
//! time from Debian's `fonts-dejavu-core` ([`crate::report::plot`]).

use std::path::Path;

use anyhow::{Context, Result};
use plotters::coord::ranged1d::{SegmentedCoord, ValueFormatter};
use plotters::coord::types::RangedCoordi32;
use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Results;
use super::{Contender, Workload};
use crate::report::plot::{plot_error, register_font};

/// Pixel size of one panel.
const PANEL_WIDTH: u32 = 640;
const PANEL_HEIGHT: u32 = 420;

/// Which metric a panel plots.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Metric {
    Tps,
    P99Ms,
}

/// Most workload columns side by side; more workloads wrap onto further rows of panel pairs.
const COLUMNS_MAX: usize = 3;

/// Draws the figure into `path`: per workload a TPS panel above a p99 panel, in a grid of at
/// most [`COLUMNS_MAX`] workloads across.
pub fn render(results: &Results, path: &Path) -> Result<()> {
    render_stacked(&[results], path)
}

/// Draws one figure per document into `path`, stacked top to bottom (one per load generator).
pub fn render_stacked(documents: &[&Results], path: &Path) -> Result<()> {
    register_font()?;
    let sizes: Vec<(u32, u32)> = documents.iter().map(|results| figure_size(results)).collect();
    let width = sizes.iter().map(|size| size.0).max().unwrap_or(PANEL_WIDTH);
    let height = sizes.iter().map(|size| size.1).sum::<u32>().max(PANEL_HEIGHT);
    let root = BitMapBackend::new(path, (width, height)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let mut rest = root.clone();
    for (results, size) in documents.iter().zip(&sizes) {
        let (area, below) = rest.split_vertically(size.1);
        draw_figure(&area, results)?;
        rest = below;
    }
    root.present().map_err(plot_error).with_context(|| format!("writing {}", path.display()))
}

/// (columns, blocks of two panel rows) of one document's figure.
fn grid(results: &Results) -> (usize, usize) {
    let count = results.workloads.len().max(1);
    let columns = count.min(COLUMNS_MAX);
    (columns, count.div_ceil(columns))
}

fn figure_size(results: &Results) -> (u32, u32) {
    let (columns, blocks) = grid(results);
    (PANEL_WIDTH * columns as u32, PANEL_HEIGHT * 2 * blocks as u32)
}

fn draw_figure(area: &DrawingArea<BitMapBackend<'_>, Shift>, results: &Results) -> Result<()> {
    let (columns, blocks) = grid(results);
    let panels = area.split_evenly((2 * blocks, columns));
    for (index, &workload) in results.workloads.iter().enumerate() {
        let (block, column) = (index / columns, index % columns);
        draw_panel(&panels[2 * block * columns + column], results, workload, Metric::Tps)?;
        draw_panel(&panels[(2 * block + 1) * columns + column], results, workload, Metric::P99Ms)?;
    }
    Ok(())
}

/// (client index, value) points of one contender; the x axis has one slot per client count,
/// labelled with the count, so the ticks are exactly the measured counts.
fn series(results: &Results, workload: Workload, contender: Contender, metric: Metric) -> Vec<(i32, f64)> {
    results
        .clients
        .iter()
        .enumerate()
        .filter_map(|(index, &clients)| {
            let cell = results.cell(workload, clients, contender)?;
            let value = match metric {
                Metric::Tps => cell.tps,
                Metric::P99Ms => cell.p99_ms,
            }?;
            (value.is_finite() && value > 0.0).then_some((index as i32, value))
        })
        .collect()
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    results: &Results,
    workload: Workload,
    metric: Metric,
) -> Result<()> {
    let all: Vec<(Contender, Vec<(i32, f64)>)> =
        results.contenders.iter().map(|&contender| (contender, series(results, workload, contender, metric))).collect();
    let values: Vec<f64> = all.iter().flat_map(|(_, points)| points.iter().map(|point| point.1)).collect();
    let generator = results.generator.label();
    let (caption, y_label) = match metric {
        Metric::Tps => (format!("{} — TPS ({generator})", workload.name()), "transactions per second"),
        Metric::P99Ms => (format!("{} — p99 latency ({generator})", workload.name()), "p99 latency (ms, log scale)"),
    };
    let mut builder = ChartBuilder::on(area);
    builder.caption(caption, ("sans-serif", 22)).margin(14).x_label_area_size(44).y_label_area_size(72);
    // An i32 range is inclusive in plotters: 0..n-1 gives exactly one segment per client count.
    let last_index = (results.clients.len() as i32 - 1).max(0);
    let x_axis = (0..last_index).into_segmented();
    let clients = &results.clients;
    if metric == Metric::Tps {
        // Headroom above the highest point keeps the legend (upper right) off the lines.
        let y_max = values.iter().copied().fold(1.0, f64::max) * 1.45;
        let mut chart = builder.build_cartesian_2d(x_axis, 0.0..y_max).map_err(plot_error)?;
        configure_mesh(&mut chart, clients, y_label)?;
        draw_lines(&mut chart, &all, SeriesLabelPosition::UpperRight)
    } else {
        let y_min = values.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
        let y_max = values.iter().copied().fold(1.0, f64::max) * 8.0;
        let mut chart = builder.build_cartesian_2d(x_axis, (y_min..y_max).log_scale()).map_err(plot_error)?;
        configure_mesh(&mut chart, clients, y_label)?;
        draw_lines(&mut chart, &all, SeriesLabelPosition::UpperLeft)
    }
}

type Chart<'a, Y> = ChartContext<'a, BitMapBackend<'a>, Cartesian2d<SegmentedCoord<RangedCoordi32>, Y>>;

fn configure_mesh<Y>(chart: &mut Chart<'_, Y>, clients: &[u32], y_label: &str) -> Result<()>
where
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let client_label = |value: &SegmentValue<i32>| match value {
        SegmentValue::CenterOf(index) => {
            usize::try_from(*index).ok().and_then(|index| clients.get(index)).map_or(String::new(), u32::to_string)
        }
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .x_desc("clients")
        .axis_desc_style(("sans-serif", 16))
        .y_desc(y_label)
        .x_labels(clients.len() + 1)
        .x_label_formatter(&client_label)
        .y_label_formatter(&|y| match *y {
            y if y >= 10.0 || y == 0.0 => format!("{y:.0}"),
            y if y >= 1.0 => format!("{y:.1}"),
            y => format!("{y:.2}"),
        })
        .label_style(("sans-serif", 14))
        .disable_x_mesh()
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(plot_error)
}

fn draw_lines<Y>(
    chart: &mut Chart<'_, Y>,
    all: &[(Contender, Vec<(i32, f64)>)],
    legend: SeriesLabelPosition,
) -> Result<()>
where
    Y: Ranged<ValueType = f64>,
{
    for (contender, points) in all {
        if points.is_empty() {
            continue;
        }
        let color = color_of(*contender);
        let centered: Vec<(SegmentValue<i32>, f64)> =
            points.iter().map(|&(index, value)| (SegmentValue::CenterOf(index), value)).collect();
        chart
            .draw_series(LineSeries::new(centered.iter().cloned(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(contender.label())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart
            .draw_series(centered.iter().map(|point| Circle::new(point.clone(), 4, color.filled())))
            .map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .position(legend)
        .label_font(("sans-serif", 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

fn color_of(contender: Contender) -> RGBColor {
    match contender {
        Contender::Direct => RGBColor(120, 120, 120),
        Contender::Pgbouncer => RGBColor(31, 119, 180),
        Contender::Pgbouncer2 => RGBColor(44, 160, 44),
        Contender::Bypass => RGBColor(214, 39, 40),
        Contender::Bypass2 => RGBColor(227, 119, 194),
        Contender::BypassKernel => RGBColor(148, 103, 189),
        Contender::BypassKernelQueue => RGBColor(23, 190, 207),
        Contender::BypassMirror => RGBColor(255, 127, 14),
        Contender::BypassKernelMirror => RGBColor(140, 86, 75),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pooler::report::tests::{run, sample_results};

    // Goal: a figure is written for results with gaps (direct only at 50 clients);
    // method: render synthetic results into a temp dir and check the PNG signature.
    #[test]
    fn renders_png() {
        let results = sample_results(vec![
            run(Workload::Select1, 50, Contender::Direct, 42_000.0, 2.0),
            run(Workload::Select1, 50, Contender::Bypass, 30_000.0, 3.0),
            run(Workload::Select1, 1000, Contender::Bypass, 28_000.0, 60.0),
            run(Workload::Select1, 1000, Contender::Pgbouncer, 20_000.0, 90.0),
        ]);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("pooler.png");
        render(&results, &path).expect("render");
        let bytes = std::fs::read(&path).expect("png written");
        assert!(bytes.starts_with(b"\x89PNG"), "not a PNG");
        // A single client count must still give a drawable axis.
        let mut single = sample_results(vec![run(Workload::Select1, 50, Contender::Bypass, 30_000.0, 3.0)]);
        single.clients = vec![50];
        render(&single, &path).expect("render one client count");
        // Six workloads wrap onto two rows of three, so the image is 3 panels wide, 4 high.
        let mut six = sample_results(vec![run(Workload::YcsbB, 50, Contender::Bypass, 30_000.0, 3.0)]);
        six.workloads = vec![
            Workload::Select1,
            Workload::SelectOnly,
            Workload::SimpleUpdate,
            Workload::YcsbA,
            Workload::YcsbB,
            Workload::YcsbC,
        ];
        render(&six, &path).expect("render six workloads");
        let bytes = std::fs::read(&path).expect("png written");
        let width = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
        let height = u32::from_be_bytes(bytes[20..24].try_into().expect("4 bytes"));
        assert_eq!((width, height), (3 * PANEL_WIDTH, 4 * PANEL_HEIGHT));
    }
}
