//! `dispatch.png`: aggregate throughput against payload size (both log scale), one line per
//! contender. Text needs a TTF font, loaded at run time from Debian's `fonts-dejavu-core`.

use std::path::Path;

use plotters::prelude::*;

use super::report::{size_label, BenchResults};
use super::Contender;
use crate::report::plot::{plot_error, register_font};
use anyhow::Result;

const COLORS: [RGBColor; 5] =
    [RGBColor(90, 90, 90), RGBColor(220, 120, 0), RGBColor(30, 110, 200), RGBColor(40, 160, 60), RGBColor(200, 30, 60)];

/// Draws the figure into `path`.
pub fn render(results: &BenchResults, path: &Path) -> Result<()> {
    register_font()?;
    let root = BitMapBackend::new(path, (1000, 620)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let values: Vec<f64> = results.throughput.iter().map(|p| p.report.throughput_gbit_s).filter(|v| *v > 0.0).collect();
    let y_min = values.iter().copied().fold(f64::INFINITY, f64::min).min(1.0) / 2.0;
    let y_max = values.iter().copied().fold(0.0, f64::max).max(1.0) * 3.0;
    let last = results.sizes.len().saturating_sub(1) as i32;
    let caption = format!(
        "Aggregate throughput vs payload — 2 clients × 2 backends, {} Mbit/s links (2-core machine)",
        results.link_rate_mbit
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(0..last, (y_min..y_max).log_scale())
        .map_err(plot_error)?;
    let sizes = results.sizes.clone();
    chart
        .configure_mesh()
        .x_desc("payload per query")
        .y_desc("Gbit/s (log scale)")
        .x_labels(sizes.len())
        .x_label_formatter(&|i| sizes.get(*i as usize).map_or(String::new(), |s| size_label(*s)))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(plot_error)?;
    for (index, &contender) in results.contenders.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let points: Vec<(i32, f64)> = series(results, contender);
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
            .map_err(plot_error)?
            .label(contender.name())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled()))).map_err(plot_error)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 15))
        .draw()
        .map_err(plot_error)?;
    root.present().map_err(plot_error)
}

fn series(results: &BenchResults, contender: Contender) -> Vec<(i32, f64)> {
    results
        .sizes
        .iter()
        .enumerate()
        .filter_map(|(i, &size)| results.gbit(contender, size).filter(|v| *v > 0.0).map(|v| (i as i32, v)))
        .collect()
}
