//! SVG plots of the results (plotters, SVG backend only): latency and throughput against
//! concurrency per prompt size, and latency against prompt size.

use std::ops::Range;
use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::gateways::Scenario;
use super::results::{BenchResults, RunResult, TARGET_CONCURRENCY, size_label};

const PANEL: (u32, u32) = (560, 420);
const FONT: (&str, u32) = ("sans-serif", 16);
/// Log axes cannot show 0: smaller values are drawn at this floor.
const SMALLEST_PLOTTED: f64 = 0.01;

/// A named series of (x, y) points; x is an index into its panel's `x_ticks`.
pub(crate) struct Line {
    pub label: String,
    pub color: RGBColor,
    pub points: Vec<(f64, f64)>,
}

/// A panel: title, axis names, the x values (evenly spaced), lines.
pub(crate) struct Panel {
    pub title: String,
    pub x_desc: &'static str,
    pub x_ticks: Vec<String>,
    pub y_desc: &'static str,
    pub lines: Vec<Line>,
}

/// Writes every plot into `dir` and returns the files written.
pub fn write_plots(results: &BenchResults, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    for size in &results.meta.sizes {
        let path = dir.join(format!("concurrency-{}.svg", short_size(*size)));
        if draw_panels(&path, &concurrency_panels(results, *size))? {
            written.push(path);
        }
    }
    let path = dir.join("prompt-size.svg");
    if draw_panels(&path, &size_panels(results))? {
        written.push(path);
    }
    Ok(written)
}

/// `1k`, `32k`, `256k`: for file names.
pub fn short_size(size: usize) -> String {
    if size >= 1024 && size.is_multiple_of(1024) {
        format!("{}k", size / 1024)
    } else {
        size.to_string()
    }
}

fn scenarios(results: &BenchResults) -> Vec<Scenario> {
    let mut scenarios = results.meta.scenarios.clone();
    scenarios.sort();
    scenarios
}

fn concurrency_panels(results: &BenchResults, size: usize) -> [Panel; 2] {
    let concurrencies = &results.meta.concurrencies;
    let line = |scenario: Scenario, value: fn(&RunResult) -> f64| Line {
        label: scenario.as_str().to_string(),
        color: color(scenario),
        points: runs_of(results, scenario, |r| r.size == size)
            .filter_map(|r| Some((index_of(concurrencies, r.concurrency)?, value(r))))
            .collect(),
    };
    let ticks: Vec<String> = concurrencies.iter().map(usize::to_string).collect();
    let label = size_label(size);
    [
        Panel {
            title: format!("Time to first byte, p50 ({label} prompt)"),
            x_desc: "concurrency",
            x_ticks: ticks.clone(),
            y_desc: "ms",
            lines: scenarios(results)
                .into_iter()
                .map(|s| line(s, |r| r.ttfb.p50_ms))
                .collect(),
        },
        Panel {
            title: format!("Throughput ({label} prompt)"),
            x_desc: "concurrency",
            x_ticks: ticks,
            y_desc: "requests/s",
            lines: scenarios(results)
                .into_iter()
                .map(|s| line(s, |r| r.throughput_rps))
                .collect(),
        },
    ]
}

fn size_panels(results: &BenchResults) -> [Panel; 2] {
    let sizes = &results.meta.sizes;
    let at_target = |r: &RunResult| r.concurrency == TARGET_CONCURRENCY;
    let ttfb = |scenario: Scenario| Line {
        label: scenario.as_str().to_string(),
        color: color(scenario),
        points: runs_of(results, scenario, at_target)
            .filter_map(|r| Some((index_of(sizes, r.size)?, r.ttfb.p50_ms)))
            .collect(),
    };
    let added = |scenario: Scenario| Line {
        label: scenario.as_str().to_string(),
        color: color(scenario),
        points: runs_of(results, scenario, at_target)
            .filter_map(|r| Some((index_of(sizes, r.size)?, r.vs_floor?.added_ttfb_p50_ms)))
            .collect(),
    };
    let proxies: Vec<Scenario> = scenarios(results)
        .into_iter()
        .filter(|s| *s != Scenario::Floor)
        .collect();
    let ticks: Vec<String> = sizes.iter().map(|s| size_label(*s)).collect();
    [
        Panel {
            title: format!("Time to first byte, p50, concurrency {TARGET_CONCURRENCY}"),
            x_desc: "prompt",
            x_ticks: ticks.clone(),
            y_desc: "ms",
            lines: scenarios(results).into_iter().map(ttfb).collect(),
        },
        Panel {
            title: format!("Added to the floor's TTFB p50, concurrency {TARGET_CONCURRENCY}"),
            x_desc: "prompt",
            x_ticks: ticks,
            y_desc: "ms",
            lines: proxies.into_iter().map(added).collect(),
        },
    ]
}

fn index_of(values: &[usize], value: usize) -> Option<f64> {
    values.iter().position(|v| *v == value).map(|i| i as f64)
}

fn runs_of<'a>(
    results: &'a BenchResults,
    scenario: Scenario,
    keep: impl Fn(&RunResult) -> bool + 'a,
) -> impl Iterator<Item = &'a RunResult> + 'a {
    results
        .runs
        .iter()
        .filter(move |r| r.scenario == scenario && keep(r))
}

/// Draws panels side by side; `false` (and no file) when there is nothing to draw.
pub(crate) fn draw_panels(path: &Path, panels: &[Panel]) -> Result<bool> {
    if panels
        .iter()
        .all(|p| p.lines.iter().all(|l| l.points.is_empty()))
    {
        return Ok(false);
    }
    let width = PANEL.0 * u32::try_from(panels.len()).unwrap_or(1);
    let root = SVGBackend::new(path, (width, PANEL.1)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let areas = root.split_evenly((1, panels.len().max(1)));
    for (area, panel) in areas.iter().zip(panels) {
        draw_panel(area, panel)?;
    }
    root.present().map_err(plot_error)?;
    Ok(true)
}

fn draw_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, panel: &Panel) -> Result<()> {
    let y = log_range(
        panel
            .lines
            .iter()
            .flat_map(|l| l.points.iter())
            .map(|p| p.1.max(SMALLEST_PLOTTED)),
    );
    let last = panel.x_ticks.len().saturating_sub(1) as f64;
    let ticks = panel.x_ticks.clone();
    let tick_label = move |x: &f64| -> String {
        let index = x.round();
        match ticks.get(index as usize) {
            Some(label) if (x - index).abs() < 1e-6 && index >= 0.0 => label.clone(),
            _ => String::new(),
        }
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, FONT)
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.4..last + 0.4, y.log_scale())
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(panel.x_desc)
        .y_desc(panel.y_desc)
        .x_labels(4 * panel.x_ticks.len().max(1) + 1)
        .x_label_formatter(&tick_label)
        .y_label_formatter(&|v| compact(*v))
        .disable_x_mesh()
        .light_line_style(WHITE)
        .bold_line_style(BLACK.mix(0.12))
        .draw()
        .map_err(plot_error)?;
    for line in panel.lines.iter().filter(|l| !l.points.is_empty()) {
        draw_line(&mut chart, line)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, LogCoord<f64>>>;

fn draw_line(chart: &mut Chart<'_, '_>, line: &Line) -> Result<()> {
    let color = line.color;
    let points: Vec<(f64, f64)> = line
        .points
        .iter()
        .map(|(x, y)| (*x, y.max(SMALLEST_PLOTTED)))
        .collect();
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .map_err(plot_error)?
        .label(line.label.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    chart
        .draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )
        .map_err(plot_error)?;
    Ok(())
}

/// A range around every value, padded so that single points and flat lines show, with
/// room above the lines for the legend.
fn log_range(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (low, high) = values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold((f64::INFINITY, 0.0f64), |(low, high), v| {
            (low.min(v), high.max(v))
        });
    if !low.is_finite() {
        return 0.1..10.0;
    }
    low / 1.6..high * 6.0
}

fn compact(value: f64) -> String {
    if value >= 100.0 || value.fract().abs() < 1e-9 {
        format!("{value:.0}")
    } else {
        format!("{value:.2}")
    }
}

pub(crate) fn color(scenario: Scenario) -> RGBColor {
    match scenario {
        Scenario::Floor => RGBColor(40, 40, 40),
        Scenario::Envoy => RGBColor(31, 119, 180),
        Scenario::EnvoyTwoHops => RGBColor(148, 103, 189),
        Scenario::EnvoyTwoHopsNamed => RGBColor(197, 176, 213),
        Scenario::Pinroute => RGBColor(214, 39, 40),
        Scenario::PinrouteNative => RGBColor(23, 190, 207),
        Scenario::PinrouteNativeTimed => RGBColor(158, 218, 229),
        Scenario::PinrouteTls => RGBColor(227, 119, 194),
        Scenario::PinrouteMtls => RGBColor(140, 86, 75),
        Scenario::Python => RGBColor(44, 160, 44),
        Scenario::VllmRouter => RGBColor(255, 127, 14),
        Scenario::VllmRouterRoundRobin => RGBColor(188, 189, 34),
    }
}

pub(crate) fn plot_error<E: std::fmt::Debug>(error: E) -> anyhow::Error {
    anyhow!("drawing a plot: {error:?}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ranges_pad_single_points() {
        let range = log_range([5.0].into_iter());
        assert!(range.start < 5.0 && range.end > 5.0);
        assert_eq!(log_range(std::iter::empty()), 0.1..10.0);
        assert_eq!(short_size(262144), "256k");
    }
}
