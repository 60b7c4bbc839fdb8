//! The dashboard's panels drawn from a real Prometheus's data (plotters, SVG): what
//! `pinroute-lab dashboard` shows in `docs/metrics.md` in place of a Grafana screenshot.

use std::path::Path;
use std::time::Duration;

use anyhow::Result;
use pinroute_harness::dashboard::Panel;
use pinroute_harness::prometheus::{Prometheus, Series};

use crate::bench::plot::plot_error;
use plotters::coord::Shift;
use plotters::prelude::*;

const PANEL: (u32, u32) = (520, 300);
const COLUMNS: usize = 3;
const FONT: (&str, u32) = ("sans-serif", 14);
const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
];

/// A panel's series over the run: legend and (seconds from the start, value).
pub struct Drawn {
    pub title: String,
    pub unit: String,
    pub lines: Vec<(String, Vec<(f64, f64)>)>,
}

/// Each panel's queries over the last `span`, one point every `step`, with Grafana's
/// `$__rate_interval` set to `rate_interval`; series that stay at zero are left out (Grafana
/// draws them, but here their legends would hide the lines that moved).
pub async fn query_panels(
    prometheus: &Prometheus,
    panels: &[Panel],
    span: Duration,
    step: Duration,
    rate_interval: &str,
) -> Result<Vec<Drawn>> {
    let mut drawn = Vec::new();
    for panel in panels {
        let mut lines = Vec::new();
        for query in &panel.queries {
            let series = prometheus
                .query_range(&query.promql(rate_interval), span, step)
                .await?;
            lines.extend(
                series
                    .iter()
                    .map(|s| (query.legend_of(&s.labels), finite(s)))
                    .filter(|(_, points)| points.iter().any(|p| p.1 != 0.0)),
            );
        }
        drawn.push(Drawn {
            title: panel.title.clone(),
            unit: panel.unit.clone(),
            lines,
        });
    }
    Ok(drawn)
}

/// A series' finite points, time counted from its first point.
fn finite(series: &Series) -> Vec<(f64, f64)> {
    let start = series.points.first().map_or(0.0, |p| p.0);
    series
        .points
        .iter()
        .filter(|p| p.1.is_finite())
        .map(|(t, v)| (t - start, *v))
        .collect()
}

/// Draws the panels in a grid of [`COLUMNS`] into one SVG file.
pub fn draw(path: &Path, panels: &[Drawn]) -> Result<()> {
    let rows = panels.len().div_ceil(COLUMNS).max(1);
    let size = (
        PANEL.0 * u32::try_from(COLUMNS)?,
        PANEL.1 * u32::try_from(rows)?,
    );
    let root = SVGBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    for (area, panel) in root.split_evenly((rows, COLUMNS)).iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present().map_err(plot_error)
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Drawn) -> Result<()> {
    let points = || panel.lines.iter().flat_map(|(_, p)| p.iter());
    let end = points().map(|p| p.0).fold(1.0, f64::max);
    let top = points().map(|p| p.1).fold(0.0, f64::max);
    let top = if top > 0.0 { top * 1.5 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, FONT)
        .margin(8)
        .x_label_area_size(28)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..end, 0.0..top)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("s")
        .y_desc(panel.unit.as_str())
        .y_label_formatter(&|v| compact(*v))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(BLACK.mix(0.12))
        .label_style(("sans-serif", 11))
        .draw()
        .map_err(plot_error)?;
    for ((legend, points), color) in panel.lines.iter().zip(PALETTE.iter().cycle()) {
        let color = *color;
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(legend.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 14, y)], color.stroke_width(2))
            });
    }
    if !panel.lines.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 10))
            .draw()
            .map_err(plot_error)?;
    }
    Ok(())
}

fn compact(value: f64) -> String {
    match value.abs() {
        v if v >= 1e9 => format!("{:.1}G", value / 1e9),
        v if v >= 1e6 => format!("{:.1}M", value / 1e6),
        v if v >= 1e3 => format!("{:.1}k", value / 1e3),
        v if v >= 10.0 || v == 0.0 => format!("{value:.0}"),
        _ => format!("{value:.2}"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn every_panel_is_drawn_into_one_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dashboard.svg");
        let panel = |title: &str| Drawn {
            title: title.to_owned(),
            unit: "reqps".to_owned(),
            lines: vec![("tiny".to_owned(), vec![(0.0, 1.0), (2.0, 3.5)])],
        };
        let empty = Drawn {
            lines: Vec::new(),
            ..panel("Idle")
        };
        draw(
            &path,
            &[panel("Requests"), panel("Errors"), panel("Pins"), empty],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        for title in ["Requests", "Errors", "Pins", "Idle", "tiny"] {
            assert!(svg.contains(title), "{title} missing");
        }
        assert_eq!(compact(1_500_000.0), "1.5M");
        assert_eq!(compact(0.25), "0.25");
    }
}
