//! `dropcompute-plot`: minimal SVG line charts (plotters, SVG backend only), shared by `simulate`'s and `tune`'s SVGs
//! (`dropcompute_cli::commands`) and `train`'s figure (`dropcompute_train::figure`).
//!
//! Owns: [`line_chart`], [`draw_chart`] (one chart on any drawing area, for multi-panel figures)
//! and [`data_ranges`]. Must not touch: computations, flags or file naming (its callers decide
//! what to draw and where). Text uses plotters' built-in "naive" font
//! path (no `ttf`/`ab_glyph` feature): the SVG carries `<text>` elements that the viewer renders
//! with its own fonts, so no system font is needed at build or run time; label extents are
//! estimated, so layout is approximate.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// One series: name, points, and whether to draw it as a line (else as points).
pub struct Series<'a> {
    /// Legend label.
    pub name: &'a str,
    /// (x, y) points.
    pub points: Vec<(f64, f64)>,
    /// Line (true) or circles (false).
    pub line: bool,
}

/// Axis ranges of a chart: x and y, in data units.
pub type Ranges = (std::ops::Range<f64>, std::ops::Range<f64>);

/// Ranges covering the finite points of `series` (y padded by 8 %, a degenerate x widened to
/// one unit), or `None` if no point is finite.
pub fn data_ranges(series: &[Series<'_>]) -> Option<Ranges> {
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in pts {
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if !(x0.is_finite() && y0.is_finite()) {
        return None;
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.08).max(1e-9);
    Some((x0..x1, (y0 - pad)..(y1 + pad)))
}

/// Draw `series` into an SVG file at `path` (800 x 500 px). `log_x` uses a log10 x axis (all x
/// must then be > 0). Errors: a message naming `path`: nothing to plot, or plotters' (I/O,
/// e.g. a missing directory).
pub fn line_chart(
    path: &Path,
    title: &str,
    x_label: &str,
    y_label: &str,
    log_x: bool,
    series: &[Series<'_>],
) -> Result<(), String> {
    let ranges = data_ranges(series).ok_or_else(|| format!("{}: nothing to plot", path.display()))?;
    let named = |e: String| format!("{}: {e}", path.display());
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| named(e.to_string()))?;
    draw_chart(&root, title, (x_label, y_label), log_x, ranges, series).map_err(named)?;
    root.present().map_err(|e| named(e.to_string()))
}

/// Draw one chart (caption, mesh, `series`, legend) on `area` over `ranges`; non-finite points
/// are skipped. `labels` are the x and y axis descriptions. Errors: a message from plotters.
pub fn draw_chart<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    labels: (&str, &str),
    log_x: bool,
    ranges: Ranges,
    series: &[Series<'_>],
) -> Result<(), String> {
    let (x_label, y_label) = labels;
    let (xr, yr) = ranges;
    let colors = [BLUE, RED, GREEN, MAGENTA, BLACK];
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw().map_err(|e| e.to_string())?;
            for (i, s) in series.iter().enumerate() {
                let c = colors[i % colors.len()];
                let pts: Vec<(f64, f64)> =
                    s.points.iter().copied().filter(|p| p.0.is_finite() && p.1.is_finite()).collect();
                if s.line {
                    chart
                        .draw_series(LineSeries::new(pts, c.stroke_width(2)))
                        .map_err(|e| e.to_string())?
                        .label(s.name)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], c));
                } else {
                    chart
                        .draw_series(pts.into_iter().map(|p| Circle::new(p, 4, c.filled())))
                        .map_err(|e| e.to_string())?
                        .label(s.name)
                        .legend(move |(x, y)| Circle::new((x + 10, y), 4, c.filled()));
                }
            }
            chart
                .configure_series_labels()
                .border_style(BLACK)
                .background_style(WHITE.mix(0.8))
                .draw()
                .map_err(|e| e.to_string())?;
        }};
    }
    let mut builder = ChartBuilder::on(area);
    builder.caption(title, ("sans-serif", 20)).margin(15).x_label_area_size(45).y_label_area_size(70);
    if log_x {
        draw!(builder.build_cartesian_2d(xr.log_scale(), yr).map_err(|e| e.to_string())?);
    } else {
        draw!(builder.build_cartesian_2d(xr, yr).map_err(|e| e.to_string())?);
    }
    Ok(())
}
