//! `pod.png`: one panel per sweep that has points, throughput against the swept value, one colour per series;
//! measured values as solid lines with dots, modelled values as thin dashed lines. Text uses
//! DejaVu Sans (Debian `fonts-dejavu-core`), loaded at run time.

use std::path::Path;

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::report::Results;
use crate::report::plot::{plot_error, register_font};

const PANEL_WIDTH: u32 = 560;
const PANEL_HEIGHT: u32 = 400;
const COLUMNS: usize = 4;
const COLOURS: [RGBColor; 4] =
    [RGBColor(214, 39, 40), RGBColor(31, 119, 180), RGBColor(44, 160, 44), RGBColor(148, 103, 189)];

const PANELS: [(&str, &str); 8] = [
    ("tpcc", "TPC-C vs remote NO/P %"),
    ("ycsb", "YCSB 95/5 vs cross %"),
    ("ycsb_mix", "YCSB at 100% cross, R/W mix"),
    ("budget", "Tigon vs HWcc budget"),
    ("swcc_ycsb", "SWcc variants, YCSB 95/5 100%"),
    ("swcc_tpcc", "SWcc variants, TPC-C 60/90"),
    ("shortcut", "Shortcut pointer"),
    ("epoch", "Epoch length, TPC-C 60/90"),
];

pub fn render(results: &Results, path: &Path) -> Result<()> {
    register_font()?;
    // Only the panels this run has points for (`--only`, `--secondary skip` leave some out).
    let panels: Vec<&(&str, &str)> =
        PANELS.iter().filter(|(panel, _)| results.points.iter().any(|point| point.panel == *panel)).collect();
    let rows = panels.len().div_ceil(COLUMNS).max(1);
    let root =
        BitMapBackend::new(path, (PANEL_WIDTH * COLUMNS as u32, PANEL_HEIGHT * rows as u32 + 30)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let (title, body) = root.split_vertically(30);
    title
        .draw_text(
            "bypass bench pod — txn/s, solid: measured (2-core machine), dashed: modelled",
            &("sans-serif", 18).into_font().color(&BLACK),
            (10, 6),
        )
        .map_err(plot_error)?;
    let areas = body.split_evenly((rows, COLUMNS));
    for ((panel, caption), area) in panels.into_iter().zip(areas.iter()) {
        draw_panel(area, results, panel, caption)?;
    }
    root.present().map_err(plot_error).with_context(|| format!("writing {}", path.display()))
}

fn draw_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    results: &Results,
    panel: &str,
    caption: &str,
) -> Result<()> {
    let points: Vec<_> = results.points.iter().filter(|point| point.panel == panel).collect();
    let mut xs: Vec<String> = Vec::new();
    let mut series: Vec<String> = Vec::new();
    for point in &points {
        if !xs.contains(&point.x) {
            xs.push(point.x.clone());
        }
        if !series.contains(&point.series) {
            series.push(point.series.clone());
        }
    }
    let top = points.iter().map(|point| point.measured_tps.max(point.modelled_tps)).fold(1.0, f64::max) * 1.15;
    let labels = xs.clone();
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 16))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(-0.5f64..(xs.len().max(1) as f64 - 0.5), 0f64..top)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_labels(xs.len().max(1))
        .x_label_formatter(&|value| {
            let index = value.round();
            if (value - index).abs() < 0.01 && index >= 0.0 {
                labels.get(index as usize).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|value| {
            if *value >= 1000.0 {
                format!("{:.0}k", value / 1000.0)
            } else {
                format!("{value:.0}")
            }
        })
        .label_style(("sans-serif", 11))
        .disable_x_mesh()
        .draw()
        .map_err(plot_error)?;
    for (index, name) in series.iter().enumerate() {
        let line = |modelled: bool| -> Vec<(f64, f64)> {
            xs.iter()
                .enumerate()
                .filter_map(|(slot, x)| {
                    let point = points.iter().find(|point| &point.series == name && &point.x == x)?;
                    let value = if modelled { point.modelled_tps } else { point.measured_tps };
                    (value > 0.0).then_some((slot as f64, value))
                })
                .collect()
        };
        draw_series(&mut chart, name, COLOURS[index % COLOURS.len()], line(false), line(true))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.3))
        .label_font(("sans-serif", 11))
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

type Chart<'a> = ChartContext<
    'a,
    BitMapBackend<'a>,
    Cartesian2d<plotters::coord::types::RangedCoordf64, plotters::coord::types::RangedCoordf64>,
>;

/// One series: measured as a solid line with dots (and a legend entry), modelled dashed.
fn draw_series(
    chart: &mut Chart<'_>,
    name: &str,
    colour: RGBColor,
    measured: Vec<(f64, f64)>,
    modelled: Vec<(f64, f64)>,
) -> Result<()> {
    chart
        .draw_series(LineSeries::new(measured.clone(), colour.stroke_width(2)))
        .map_err(plot_error)?
        .label(name)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2)));
    chart.draw_series(measured.iter().map(|&(x, y)| Circle::new((x, y), 3, colour.filled()))).map_err(plot_error)?;
    chart.draw_series(DashedLineSeries::new(modelled, 5, 4, colour.stroke_width(1))).map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::report::{PerCommit, Point};
    use crate::pod::{BenchArgs, Sweep};

    #[test]
    fn renders_a_png_from_points() {
        // Goal: the figure renders from results. Method: two points, render, check the PNG signature.
        let args = BenchArgs {
            out: "unused".into(),
            repetitions: 1,
            warmup_ms: 0,
            measure_ms: 0,
            quick: true,
            secondary: crate::pod::Secondary::Full,
            short_warmup_ms: 0,
            short_measure_ms: 0,
            only: Vec::new(),
            small_warehouses: true,
            keys_per_host: 10,
            hosts: 2,
            log_dir: None,
        };
        let mut results = Results::new(&args);
        for (x, tps) in [("0/0", 1000.0), ("60/90", 900.0)] {
            results.points.push(Point {
                sweep: Sweep::Tpcc,
                panel: "tpcc",
                series: "Tigon-style".into(),
                x: x.into(),
                hwcc_budget_bytes: 0,
                warmup_ms: 0,
                measure_ms: 0,
                measured_tps: tps,
                modelled_tps: tps * 0.8,
                abort_rate: 0.0,
                commit_latency_p50_us: 0,
                commit_latency_p99_us: 0,
                hwcc_peak_bytes: 0,
                per_commit: PerCommit::default(),
                runs: Vec::new(),
            });
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("pod.png");
        render(&results, &path).expect("render");
        let bytes = std::fs::read(&path).expect("png");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    }
}
