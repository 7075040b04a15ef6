//! The SVG figure of `dropcompute train`: step time and train loss per step, one series per run
//! (baseline vs DropCompute), two stacked panels.
//!
//! Owns: [`Series`], [`figure_svg`], [`write_figure`]. Drawing goes through the shared
//! `dropcompute_plot::draw_chart` (plotters, SVG backend, no system fonts). Must not touch: the
//! measurements (the driver supplies them) or the output directory layout.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use dropcompute_plot::{self as plot, Ranges};

/// Figure size, px (width, height): two 800 x 450 panels.
pub const SIZE: (u32, u32) = (800, 900);

/// One run's per-step measurements. Index i is step i (0-based); NaN or infinite entries are
/// skipped (e.g. a diverged loss), the two vectors may differ in length.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend label, e.g. "baseline" or "dropcompute (tau = 25 ms)".
    pub label: String,
    /// Wall time of each step, ms.
    pub step_ms: Vec<f64>,
    /// Training loss of each step.
    pub loss: Vec<f64>,
}

/// Errors of the figure.
#[derive(Debug, thiserror::Error)]
pub enum FigureError {
    /// No series has a single finite step time or loss: there is nothing to draw.
    #[error("figure: no finite step time or loss in {series} series")]
    NoData {
        /// Number of series given.
        series: usize,
    },
    /// plotters failed (message from the backend).
    #[error("figure: drawing failed: {0}")]
    Draw(String),
    /// Writing the SVG file failed.
    #[error("figure: writing {}: {source}", path.display())]
    Io {
        /// The SVG path.
        path: PathBuf,
        /// OS error.
        #[source]
        source: std::io::Error,
    },
}

fn points(v: &[f64]) -> Vec<(f64, f64)> {
    v.iter().enumerate().filter(|(_, y)| y.is_finite()).map(|(i, &y)| (i as f64, y)).collect()
}

/// Render the figure as an SVG document: top panel step time (ms) vs step, bottom panel train
/// loss vs step, one coloured line per series with a legend. A panel without finite data is
/// drawn empty on a unit range.
/// Errors: [`FigureError::NoData`] if neither panel has a finite point (including no series),
/// [`FigureError::Draw`] from plotters.
pub fn figure_svg(series: &[Series]) -> Result<String, FigureError> {
    let step: Vec<plot::Series<'_>> =
        series.iter().map(|s| plot::Series { name: &s.label, points: points(&s.step_ms), line: true }).collect();
    let loss: Vec<plot::Series<'_>> =
        series.iter().map(|s| plot::Series { name: &s.label, points: points(&s.loss), line: true }).collect();
    let (step_r, loss_r) = (plot::data_ranges(&step), plot::data_ranges(&loss));
    if step_r.is_none() && loss_r.is_none() {
        return Err(FigureError::NoData { series: series.len() });
    }
    let unit: Ranges = (0.0..1.0, 0.0..1.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| FigureError::Draw(e.to_string()))?;
        let panels = root.split_evenly((2, 1));
        let draw = |i: usize, title: &str, y: &str, r: Option<Ranges>, s: &[plot::Series<'_>]| {
            plot::draw_chart(&panels[i], title, ("step", y), false, r.unwrap_or_else(|| unit.clone()), s)
                .map_err(FigureError::Draw)
        };
        draw(0, "Step time", "step time (ms)", step_r, &step)?;
        draw(1, "Train loss", "loss", loss_r, &loss)?;
        root.present().map_err(|e| FigureError::Draw(e.to_string()))?;
    }
    Ok(svg)
}

/// [`figure_svg`] written to `path` (replaced if present).
/// Errors: those of [`figure_svg`], and [`FigureError::Io`] if the file cannot be written.
pub fn write_figure(path: &Path, series: &[Series]) -> Result<(), FigureError> {
    let svg = figure_svg(series)?;
    std::fs::write(path, svg).map_err(|source| FigureError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_runs() -> Vec<Series> {
        let steps = 30;
        let base = Series {
            label: "baseline".into(),
            step_ms: (0..steps).map(|i| 40.0 + f64::from(i % 7)).collect(),
            loss: (0..steps).map(|i| 2.3 * (-0.1 * f64::from(i)).exp()).collect(),
        };
        let dc = Series {
            label: "dropcompute".into(),
            step_ms: (0..steps).map(|i| 30.0 + f64::from(i % 3)).collect(),
            loss: (0..steps).map(|i| 2.3 * (-0.09 * f64::from(i)).exp()).collect(),
        };
        vec![base, dc]
    }

    #[test]
    fn writes_an_svg_with_both_labels_and_both_panels() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("figure.svg");
        write_figure(&path, &two_runs()).expect("figure");
        let svg = std::fs::read_to_string(&path).expect("read");
        assert!(svg.trim_start().starts_with("<svg"), "{}", &svg[..svg.len().min(80)]);
        assert!(svg.trim_end().ends_with("</svg>"));
        for text in ["baseline", "dropcompute", "Step time", "Train loss", "step time (ms)"] {
            assert!(svg.contains(text), "missing {text}");
        }
        // Series 0 is blue, series 1 red (plot::draw_chart's palette), data lines 2 px wide:
        // one per panel, 30 points each.
        for colour in ["#0000FF", "#FF0000"] {
            assert_eq!(data_lines(&svg, colour), [30, 30], "{colour}");
        }
    }

    /// Point counts of the 2 px polylines of `colour` (the data lines, not mesh or legend).
    fn data_lines(svg: &str, colour: &str) -> Vec<usize> {
        svg.split("<polyline")
            .skip(1)
            .filter(|e| e.contains(&format!("stroke=\"{colour}\" stroke-width=\"2\"")))
            .map(|e| {
                let pts = e.split("points=\"").nth(1).and_then(|p| p.split('"').next()).unwrap_or("");
                pts.split_whitespace().count()
            })
            .collect()
    }

    /// Numeric tick labels of panel `panel` (0 = step time, top; 1 = loss, bottom) as
    /// (x labels, y labels): a label belongs to the panel its y coordinate falls in; y labels
    /// are right-aligned to the left of the axis (`text-anchor="end"`), x labels are not.
    fn tick_labels(svg: &str, panel: usize) -> (Vec<f64>, Vec<f64>) {
        let half = f64::from(SIZE.1) / 2.0;
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for e in svg.split("<text").skip(1) {
            let attr = |name: &str| e.split(&format!(" {name}=\"")).nth(1).and_then(|v| v.split('"').next());
            let Some(Ok(v)) = e.split('>').nth(1).and_then(|t| t.split('<').next()).map(|t| t.trim().parse::<f64>())
            else {
                continue;
            };
            let y: f64 = attr("y").and_then(|y| y.parse().ok()).expect("a text element has a y coordinate");
            if (y / half) as usize != panel {
                continue;
            }
            if attr("text-anchor") == Some("end") { ys.push(v) } else { xs.push(v) }
        }
        (xs, ys)
    }

    /// The axes of panel `panel` cover `data` (x 0..len-1 and the finite y values, y padded as
    /// `plot::data_ranges` does) and nothing far beyond: every tick label lies inside the padded
    /// range, and the labels span most of it.
    fn assert_axes_cover(svg: &str, panel: usize, x_max: f64, (y_min, y_max): (f64, f64)) {
        let (xs, ys) = tick_labels(svg, panel);
        let pad = (y_max - y_min) * 0.08;
        assert!(xs.len() >= 3 && ys.len() >= 3, "panel {panel}: x labels {xs:?}, y labels {ys:?}");
        assert!(xs.iter().all(|&x| (0.0..=x_max).contains(&x)), "panel {panel}: x labels {xs:?} outside 0..={x_max}");
        assert!(xs.iter().cloned().fold(f64::INFINITY, f64::min) <= 0.2 * x_max, "panel {panel}: {xs:?}");
        assert!(xs.iter().cloned().fold(0.0, f64::max) >= 0.8 * x_max, "panel {panel}: {xs:?}");
        let inside = |y: f64| y >= y_min - pad - 1e-9 && y <= y_max + pad + 1e-9;
        assert!(ys.iter().all(|&y| inside(y)), "panel {panel}: y labels {ys:?} outside {y_min}..{y_max} (+{pad})");
        let span =
            ys.iter().cloned().fold(f64::NEG_INFINITY, f64::max) - ys.iter().cloned().fold(f64::INFINITY, f64::min);
        assert!(span >= 0.5 * (y_max - y_min), "panel {panel}: y labels {ys:?} span too little of {y_min}..{y_max}");
    }

    #[test]
    fn axes_ranges_match_the_data_of_each_panel() {
        let s = two_runs();
        let svg = figure_svg(&s).expect("figure");
        // Step time: baseline 40..46 ms, DropCompute 30..32 ms, steps 0..29.
        assert_axes_cover(&svg, 0, 29.0, (30.0, 46.0));
        // Loss: 2.3·exp(-0.1·29) ..= 2.3 (both runs; the DropCompute loss decays more slowly).
        assert_axes_cover(&svg, 1, 29.0, (2.3 * (-0.1f64 * 29.0).exp(), 2.3));
        // A shorter, higher series moves the step-time axes with it.
        let mut t = s.clone();
        t[0].step_ms = vec![100.0, 140.0, 120.0];
        t[1].step_ms = vec![90.0, 95.0, 110.0];
        let svg = figure_svg(&t).expect("figure");
        assert_axes_cover(&svg, 0, 2.0, (90.0, 140.0));
        assert_eq!(data_lines(&svg, "#0000FF"), [3, 30]);
    }

    #[test]
    fn nan_points_are_skipped_not_fatal() {
        let mut s = two_runs();
        s[1].loss[5] = f64::NAN;
        s[1].loss[6] = f64::INFINITY;
        s[0].step_ms[0] = f64::NAN;
        let svg = figure_svg(&s).expect("figure");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "non-finite value leaked into the SVG");
        // Panels in order: step time, then loss.
        assert_eq!(data_lines(&svg, "#0000FF"), [29, 30]);
        assert_eq!(data_lines(&svg, "#FF0000"), [30, 28]);
    }

    #[test]
    fn all_nan_loss_still_draws_the_step_times() {
        let mut s = two_runs();
        for x in s.iter_mut().flat_map(|s| s.loss.iter_mut()) {
            *x = f64::NAN;
        }
        let svg = figure_svg(&s).expect("figure");
        assert!(svg.contains("Train loss") && svg.contains("dropcompute"));
        // Both series are drawn in the step-time panel only (30 points each); the loss panel has
        // no data line and falls back to the unit range on both axes.
        for colour in ["#0000FF", "#FF0000"] {
            assert_eq!(data_lines(&svg, colour), [30], "{colour}");
        }
        assert_axes_cover(&svg, 0, 29.0, (30.0, 46.0));
        let (xs, ys) = tick_labels(&svg, 1);
        assert!(!xs.is_empty() && !ys.is_empty(), "the empty loss panel still has axes");
        assert!(xs.iter().chain(&ys).all(|v| (0.0..=1.0).contains(v)), "unit range: x {xs:?}, y {ys:?}");
        // Also when the step times are the all-NaN ones: the loss panel is drawn, the step panel
        // is empty.
        let mut s = two_runs();
        for x in s.iter_mut().flat_map(|s| s.step_ms.iter_mut()) {
            *x = f64::NAN;
        }
        let svg = figure_svg(&s).expect("figure");
        assert_eq!(data_lines(&svg, "#0000FF"), [30]);
        let (xs, ys) = tick_labels(&svg, 0);
        assert!(xs.iter().chain(&ys).all(|v| (0.0..=1.0).contains(v)), "unit range: x {xs:?}, y {ys:?}");
        assert_axes_cover(&svg, 1, 29.0, (2.3 * (-0.1f64 * 29.0).exp(), 2.3));
    }

    #[test]
    fn empty_input_is_a_typed_error() {
        assert!(matches!(figure_svg(&[]), Err(FigureError::NoData { series: 0 })));
        let empty = Series { label: "x".into(), step_ms: vec![], loss: vec![f64::NAN] };
        assert!(matches!(figure_svg(&[empty]), Err(FigureError::NoData { series: 1 })));
    }

    #[test]
    fn unwritable_path_is_an_io_error() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let path = dir.path().join("missing").join("f.svg");
        match write_figure(&path, &two_runs()) {
            Err(FigureError::Io { path: p, .. }) => assert_eq!(p, path),
            other => panic!("expected an Io error naming the path, got {other:?}"),
        }
    }
}
