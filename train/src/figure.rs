//! The SVG figure of `dropcompute train`: step time and train loss per step, and train loss
//! against time (the running sum of step times), one series per run (baseline vs DropCompute),
//! three stacked panels. The third panel is the comparison that matters: a run that drops work
//! makes less progress per step but takes shorter steps.
//!
//! Owns: [`Series`], [`figure_svg`], [`write_figure`]. Drawing goes through the shared
//! `dropcompute_plot::draw_chart` (plotters, SVG backend, no system fonts). Must not touch: the
//! measurements (the driver supplies them) or the output directory layout.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use dropcompute_plot::{self as plot, Ranges};

/// Figure size, px (width, height): three 800 x 450 panels.
pub const SIZE: (u32, u32) = (800, 1350);

/// Panels of the figure, top to bottom.
const PANELS: usize = 3;

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

/// (time at the end of step i in s, loss of step i): the time is the running sum of the finite
/// step times (ms / 1000); a step whose time or loss is not finite has no point, and a step
/// whose time is not finite adds nothing to the sum (the time axis then runs short by it).
fn loss_over_time(s: &Series) -> Vec<(f64, f64)> {
    let mut t_s = 0.0;
    let mut out = Vec::new();
    for (i, &loss) in s.loss.iter().enumerate() {
        let Some(&ms) = s.step_ms.get(i).filter(|ms| ms.is_finite()) else { continue };
        t_s += ms / 1e3;
        if loss.is_finite() {
            out.push((t_s, loss));
        }
    }
    out
}

/// Render the figure as an SVG document: top panel step time (ms) vs step, middle panel train
/// loss vs step, bottom panel train loss vs time (s, [`loss_over_time`]), one coloured line per
/// series with a legend. A panel without finite data is drawn empty on a unit range.
/// Errors: [`FigureError::NoData`] if neither panel has a finite point (including no series),
/// [`FigureError::Draw`] from plotters.
pub fn figure_svg(series: &[Series]) -> Result<String, FigureError> {
    let step: Vec<plot::Series<'_>> =
        series.iter().map(|s| plot::Series { name: &s.label, points: points(&s.step_ms), line: true }).collect();
    let loss: Vec<plot::Series<'_>> =
        series.iter().map(|s| plot::Series { name: &s.label, points: points(&s.loss), line: true }).collect();
    let time: Vec<plot::Series<'_>> =
        series.iter().map(|s| plot::Series { name: &s.label, points: loss_over_time(s), line: true }).collect();
    let (step_r, loss_r, time_r) = (plot::data_ranges(&step), plot::data_ranges(&loss), plot::data_ranges(&time));
    if step_r.is_none() && loss_r.is_none() {
        return Err(FigureError::NoData { series: series.len() });
    }
    let unit: Ranges = (0.0..1.0, 0.0..1.0);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| FigureError::Draw(e.to_string()))?;
        let panels = root.split_evenly((PANELS, 1));
        let draw = |i: usize, title: &str, axes: (&str, &str), r: Option<Ranges>, s: &[plot::Series<'_>]| {
            plot::draw_chart(&panels[i], title, axes, false, r.unwrap_or_else(|| unit.clone()), s)
                .map_err(FigureError::Draw)
        };
        draw(0, "Step time", ("step", "step time (ms)"), step_r, &step)?;
        draw(1, "Train loss", ("step", "loss"), loss_r, &loss)?;
        draw(2, "Train loss against time", ("time (s, sum of step times)", "loss"), time_r, &time)?;
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
        for text in ["baseline", "dropcompute", "Step time", "Train loss", "step time (ms)", "Train loss against time"]
        {
            assert!(svg.contains(text), "missing {text}");
        }
        // Series 0 is blue, series 1 red (plot::draw_chart's palette), data lines 2 px wide:
        // one per panel, 30 points each.
        for colour in ["#0000FF", "#FF0000"] {
            assert_eq!(data_lines(&svg, colour), [30, 30, 30], "{colour}");
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

    /// Numeric tick labels of panel `panel` (0 = step time, top; 1 = loss; 2 = loss vs time) as
    /// (x labels, y labels): a label belongs to the panel its y coordinate falls in; y labels
    /// are right-aligned to the left of the axis (`text-anchor="end"`), x labels are not.
    fn tick_labels(svg: &str, panel: usize) -> (Vec<f64>, Vec<f64>) {
        let height = f64::from(SIZE.1) / PANELS as f64;
        let (mut xs, mut ys) = (Vec::new(), Vec::new());
        for e in svg.split("<text").skip(1) {
            let attr = |name: &str| e.split(&format!(" {name}=\"")).nth(1).and_then(|v| v.split('"').next());
            let Some(Ok(v)) = e.split('>').nth(1).and_then(|t| t.split('<').next()).map(|t| t.trim().parse::<f64>())
            else {
                continue;
            };
            let y: f64 = attr("y").and_then(|y| y.parse().ok()).expect("a text element has a y coordinate");
            if (y / height) as usize != panel {
                continue;
            }
            if attr("text-anchor") == Some("end") { ys.push(v) } else { xs.push(v) }
        }
        (xs, ys)
    }

    /// The axes of panel `panel` cover `data` (x 0..=x_max and the finite y values, y padded as
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
        // Loss against time: x up to the slower run's total, the baseline's sum of step times.
        let total_s: f64 = s[0].step_ms.iter().sum::<f64>() / 1e3;
        assert_axes_cover(&svg, 2, total_s, (2.3 * (-0.1f64 * 29.0).exp(), 2.3));
        // A shorter, higher series moves the step-time axes with it.
        let mut t = s.clone();
        t[0].step_ms = vec![100.0, 140.0, 120.0];
        t[1].step_ms = vec![90.0, 95.0, 110.0];
        let svg = figure_svg(&t).expect("figure");
        assert_axes_cover(&svg, 0, 2.0, (90.0, 140.0));
        assert_eq!(data_lines(&svg, "#0000FF"), [3, 30, 3]);
    }

    #[test]
    fn nan_points_are_skipped_not_fatal() {
        let mut s = two_runs();
        s[1].loss[5] = f64::NAN;
        s[1].loss[6] = f64::INFINITY;
        s[0].step_ms[0] = f64::NAN;
        let svg = figure_svg(&s).expect("figure");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "non-finite value leaked into the SVG");
        // Panels in order: step time, loss, loss against time (a point needs both).
        assert_eq!(data_lines(&svg, "#0000FF"), [29, 30, 29]);
        assert_eq!(data_lines(&svg, "#FF0000"), [30, 28, 28]);
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
    fn loss_over_time_is_the_running_sum_of_step_times() {
        let s =
            Series { label: "x".into(), step_ms: vec![10.0, f64::NAN, 30.0, 5.0], loss: vec![4.0, 3.0, f64::NAN, 1.0] };
        // Step 1's time is unknown (no point, adds nothing), step 2's loss is (no point, adds
        // its 30 ms).
        assert_eq!(loss_over_time(&s), vec![(0.010, 4.0), (0.045, 1.0)]);
        let r = &two_runs()[1];
        let pts = loss_over_time(r);
        let mut sum = 0.0f64;
        for (i, &(t, l)) in pts.iter().enumerate() {
            sum += r.step_ms[i];
            assert!((t - sum / 1e3).abs() < 1e-12 && l == r.loss[i], "step {i}: ({t}, {l})");
        }
        // A loss longer than the step times: the steps without a time have no point.
        let short = Series { label: "y".into(), step_ms: vec![1.0], loss: vec![1.0, 2.0] };
        assert_eq!(loss_over_time(&short), vec![(0.001, 1.0)]);
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
